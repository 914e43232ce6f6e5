//! The configuration file on the command line: `serve` reads it before its
//! flags are parsed for good ([`with_config_file`]), and `jobfence config
//! check FILE` prints the configuration `serve` would run with, each value
//! with where it came from (src/config_file.rs has the rules).

use crate::cli::Cli;
use crate::config_file::{self, ConfigFile};
use anyhow::Context;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, CommandFactory, Subcommand};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `jobfence config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check a configuration file and print the configuration `jobfence
    /// serve --config FILE` would run with here: every option, its value
    /// (secrets masked) and where it came from (a flag, the environment,
    /// the file and its line, the default). Flags after `--` are taken as
    /// serve's. Exit status 1 when the file is refused.
    Check {
        /// The file (TOML), e.g. /etc/jobfence/jobfence.toml.
        file: PathBuf,
        /// `serve` flags, as they would be given to it.
        #[arg(last = true)]
        serve_flags: Vec<OsString>,
    },
    /// Print a configuration file with every option commented out: its
    /// help, and its default or an example value (the package installs it
    /// as /etc/jobfence/jobfence.toml).
    Example,
}

/// Example values of the options that have no default, where the
/// package's layout suggests one (the unit's state directory, /etc/jobfence).
const EXAMPLES: [(&str, &str); 6] = [
    ("database_url", "mysql://jobfence@127.0.0.1:3306/jobfence"),
    ("database_password_file", "/etc/jobfence/database-password"),
    ("prune_archive_dir", "/var/lib/jobfence"),
    ("tls_cert", "/etc/jobfence/server.pem"),
    ("tls_key", "/etc/jobfence/server-key.pem"),
    ("callers", "/etc/jobfence/callers"),
];

/// The `jobfence` command with every global option propagated to its
/// subcommands.
fn built() -> Command {
    let mut cmd = Cli::command();
    cmd.build();
    cmd
}

/// The configuration file `serve` reads: `--config` or `JOBFENCE_CONFIG`,
/// else [`config_file::DEFAULT_PATH`] when it exists, else none.
fn config_path(serve: &ArgMatches) -> Option<PathBuf> {
    if let Some(p) = serve.get_one::<PathBuf>("config") {
        return Some(p.clone());
    }
    let default = Path::new(config_file::DEFAULT_PATH);
    default.exists().then(|| default.to_owned())
}

/// What the configuration file gives `serve`.
#[derive(Default)]
struct FromFile {
    /// The flags to add to the command line.
    flags: Vec<OsString>,
    /// The option ids taken from the file, with their lines.
    lines: BTreeMap<String, usize>,
    /// The file (none when `serve` reads none).
    file: Option<ConfigFile>,
}

/// The command the command line names at its deepest (`migrate status`,
/// `restore fence`, `serve`), and its matches.
fn leaf<'c>(cmd: &'c Command, matches: &'c ArgMatches) -> (&'c Command, &'c ArgMatches) {
    let (mut cmd, mut matches) = (cmd, matches);
    while let Some((name, sub)) = matches.subcommand() {
        cmd = cmd
            .find_subcommand(name)
            .expect("a matched subcommand exists");
        matches = sub;
    }
    (cmd, matches)
}

/// The file's values as flags for `target` (a subcommand of `cmd` that
/// takes `--config`) matched as `matches`.
fn file_flags(cmd: &Command, target: &Command, matches: &ArgMatches) -> anyhow::Result<FromFile> {
    let Some(path) = config_path(matches) else {
        return Ok(FromFile::default());
    };
    let file = ConfigFile::read(&path)?;
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    let (flags, lines) = config_file::flags(cmd, target, &file, given)?;
    Ok(FromFile {
        flags,
        lines,
        file: Some(file),
    })
}

/// `args` (the process's command line) with the configuration file's
/// values added as flags when the command takes `--config` (`serve`, and
/// the commands that reach the database: `migrate`, `prune`, `restore
/// fence`); unchanged for any other command, or when the command line
/// does not parse (clap then says why, as always). Errors: the file is
/// missing or refused.
pub fn with_config_file(mut args: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let cmd = built();
    let Ok(matches) = cmd.clone().try_get_matches_from(&args) else {
        return Ok(args);
    };
    let (target, leaf_matches) = leaf(&cmd, &matches);
    if !target.get_arguments().any(|a| a.get_id() == "config") {
        return Ok(args);
    }
    args.extend(file_flags(&cmd, target, leaf_matches)?.flags);
    Ok(args)
}

/// `jobfence config`: `check` prints to `out` every option `serve` would
/// run with, `key = value  # source`; `example` a file with every option
/// commented out.
pub fn run(args: ConfigArgs, out: &mut impl Write) -> anyhow::Result<()> {
    match args.command {
        ConfigCommand::Check { file, serve_flags } => check(file, serve_flags, out),
        ConfigCommand::Example => example(out),
    }
}

/// `jobfence config example`.
fn example(out: &mut impl Write) -> anyhow::Result<()> {
    let cmd = built();
    let serve = cmd.find_subcommand("serve").expect("serve is a command");
    writeln!(
        out,
        "# jobfence serve's configuration (TOML). Every option of `jobfence serve --help`\n\
         # is a key: its long name with _ for -. A flag or a JOBFENCE_* variable wins\n\
         # over this file; a key left commented out keeps its default. Each value\n\
         # shown is the default, or an example where there is none to show (the\n\
         # database, the files): `jobfence config check` prints the defaults.\n\
         # Check it with: jobfence config check /etc/jobfence/jobfence.toml"
    )?;
    for (key, arg) in config_file::keys(serve) {
        writeln!(out)?;
        let help = arg.get_long_help().or(arg.get_help());
        for line in help.map(|h| h.to_string()).unwrap_or_default().lines() {
            write_wrapped(out, line)?;
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let example = EXAMPLES.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let value = match (defaults.as_slice(), example) {
            (_, Some(e)) => shown(e),
            ([], None) if !arg.get_action().takes_values() => "false".to_owned(),
            ([], None) => format!("\"<{}>\"", key.to_uppercase()),
            ([one], None) => shown(one),
            (many, None) => format!("{many:?}"),
        };
        writeln!(out, "# {key} = {value}")?;
    }
    Ok(())
}

/// `text` as comment lines of at most 78 columns.
fn write_wrapped(out: &mut impl Write, text: &str) -> std::io::Result<()> {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.len() + 1 + word.len() > 78 {
            writeln!(out, "{line}")?;
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    writeln!(out, "{line}")
}

/// A value as the file writes it: numbers and booleans bare, the rest
/// quoted.
fn shown(v: &str) -> String {
    if v.parse::<i64>().is_ok() || v == "true" || v == "false" {
        v.to_owned()
    } else {
        format!("{v:?}")
    }
}

/// `jobfence config check`.
fn check(file: PathBuf, serve_flags: Vec<OsString>, out: &mut impl Write) -> anyhow::Result<()> {
    let cmd = built();
    let mut argv: Vec<OsString> = vec!["jobfence".into(), "serve".into()];
    argv.extend(["--config".into(), file.clone().into_os_string()]);
    argv.extend(serve_flags);
    let first = cmd.clone().try_get_matches_from(&argv)?;
    let (_, serve) = first.subcommand().expect("serve");
    let serve_cmd = cmd.find_subcommand("serve").expect("serve is a command");
    let FromFile { flags, lines, file } = file_flags(&cmd, serve_cmd, serve)?;
    argv.extend(flags);
    let matches = cmd.clone().try_get_matches_from(&argv)?;
    let (_, serve) = matches.subcommand().expect("serve");
    // What serve refuses after parsing, refused here too.
    <crate::serve_cli::ServeArgs as clap::FromArgMatches>::from_arg_matches(serve)?
        .check()
        .context("serve would refuse this configuration")?;
    writeln!(
        out,
        "# jobfence serve --config {}: the configuration it would run with here\n\
         # (precedence: flag > environment > file > default)",
        file.as_ref()
            .map_or("-".into(), |f| f.path.display().to_string())
    )?;
    for (key, arg) in config_file::keys(serve_cmd) {
        let source = config_file::source(serve, arg, file.as_ref(), &lines);
        let raw: Vec<String> = serve
            .get_raw(arg.get_id().as_str())
            .map(|vs| vs.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let shown = match raw.as_slice() {
            [] if !arg.get_action().takes_values() => "false".to_owned(),
            [] => {
                writeln!(out, "# {key} = (unset)")?;
                continue;
            }
            [one] if !arg.get_action().takes_values() => one.clone(),
            [one] => shown(&config_file::masked(&key, one)),
            many => format!(
                "[{}]",
                many.iter()
                    .map(|v| format!("{:?}", config_file::masked(&key, v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        writeln!(out, "{key} = {shown}  # {source}")?;
    }
    Ok(())
}
