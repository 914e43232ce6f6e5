//! `serve --config FILE`: the configuration file (TOML), one key per
//! `serve` option (its long name with `_` for `-`: `--default-lease` is
//! `default_lease`).
//!
//! Precedence, highest first: a flag, its `JOBFENCE_*` environment
//! variable, the file, the built-in default (docs/configuration.md). The
//! file is read before the command line is parsed for good: every key is
//! checked against the option it names with that option's own parser, and
//! the keys no flag or variable already set become flags. So the file
//! takes exactly the values a flag takes, and a mistake (an unknown key, a
//! value of the wrong type, a bad duration) stops the start with the
//! file's line and key.

use anyhow::{bail, Context};
use clap::error::{ContextKind, ContextValue};
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use toml::{Spanned, Value};

/// The file `serve` reads when neither `--config` nor `JOBFENCE_CONFIG`
/// names one and it exists (the package installs it, every key
/// commented out).
pub const DEFAULT_PATH: &str = "/etc/jobfence/jobfence.toml";

/// Options that are not keys of the file: the file's own name, and the
/// help.
const NOT_KEYS: [&str; 3] = ["config", "help", "version"];

/// One `key = value` of the file, with its line (1-based).
#[derive(Debug, Clone)]
pub struct Entry {
    pub key: String,
    pub line: usize,
    pub value: Value,
}

/// A configuration file read and parsed (not yet checked against the
/// options: see [`flags`]).
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub entries: Vec<Entry>,
}

impl ConfigFile {
    /// Reads and parses `path`. Errors: the file cannot be read (a
    /// missing file is refused, never skipped), or it is not TOML (with
    /// the line of the mistake).
    pub fn read(path: &Path) -> anyhow::Result<ConfigFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the configuration file {}", path.display()))?;
        Self::parse(path, &text)
    }

    /// Parses `text`, the contents of `path`: one table of keys (sections
    /// are refused: every option is a top-level key).
    pub fn parse(path: &Path, text: &str) -> anyhow::Result<ConfigFile> {
        let table: BTreeMap<Spanned<String>, Spanned<Value>> = match toml::from_str(text) {
            Ok(t) => t,
            Err(e) => {
                let at = e
                    .span()
                    .map_or(String::new(), |s| format!(":{}", line_of(text, s.start)));
                bail!("{}{at}: {}", path.display(), e.message());
            }
        };
        let mut entries: Vec<Entry> = table
            .into_iter()
            .map(|(k, v)| Entry {
                line: line_of(text, k.span().start),
                key: k.into_inner(),
                value: v.into_inner(),
            })
            .collect();
        entries.sort_by_key(|e| e.line);
        Ok(ConfigFile {
            path: path.to_owned(),
            entries,
        })
    }

    /// `path:line: key `k`` — how a mistake names its place.
    fn at(&self, e: &Entry) -> String {
        format!("{}:{}: key `{}`", self.path.display(), e.line, e.key)
    }
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The file's keys as flags of `target` (`root`: the `jobfence` command,
/// built; `target`: `serve`, or another of its subcommands that takes
/// `--config`, which takes the keys naming options of its own), each key
/// checked as `serve`'s option:
/// the flags to append to the command line, and for each option taken
/// from the file its line (by option id). A key whose option `given`
/// already has (from a flag or the environment) is checked but not
/// applied.
///
/// Errors: an unknown key, a value of the wrong kind (a table, an array
/// for an option that takes one value, not a boolean for a switch), or a
/// value the option's parser refuses (a bad duration, address, number),
/// each naming the file, line and key.
pub fn flags(
    root: &Command,
    target: &Command,
    file: &ConfigFile,
    given: impl Fn(&str) -> bool,
) -> anyhow::Result<(Vec<OsString>, BTreeMap<String, usize>)> {
    let mut args = Vec::new();
    let mut lines = BTreeMap::new();
    let serve = root.find_subcommand("serve").expect("serve is a command");
    for entry in &file.entries {
        if let Value::Table(_) = entry.value {
            bail!(
                "{}: a table or section: the file has none, every option is a top-level key",
                file.at(entry)
            );
        }
        let Some(arg) = option(serve, &entry.key) else {
            let hint = option(serve, &entry.key.replace('-', "_")).map_or(String::new(), |_| {
                format!(": did you mean {}?", entry.key.replace('-', "_"))
            });
            bail!(
                "{}: unknown key (the keys are `jobfence serve --help`'s options, with _ for -: \
                 listen, database_url, default_lease, …){hint}",
                file.at(entry)
            );
        };
        let long = arg.get_long().expect("options have a long name");
        let values =
            values_of(arg, &entry.value).map_err(|e| anyhow::anyhow!("{}: {e}", file.at(entry)))?;
        for v in &values {
            check_value(root, arg, v).map_err(|e| anyhow::anyhow!("{}: {e}", file.at(entry)))?;
        }
        // Another command than serve takes the keys that are options of
        // its own (the database's, the retention's).
        if !target.get_arguments().any(|a| a.get_long() == Some(long)) {
            continue;
        }
        let id = arg.get_id().as_str();
        if given(id) {
            continue;
        }
        lines.insert(id.to_owned(), entry.line);
        if !arg.get_action().takes_values() {
            if values == ["true"] {
                args.push(OsString::from(format!("--{long}")));
            }
            continue;
        }
        args.extend(
            values
                .iter()
                .map(|v| OsString::from(format!("--{long}={v}"))),
        );
    }
    Ok((args, lines))
}

/// The option a key names: `serve`'s visible options by long name, `_`
/// for `-`.
pub fn option<'c>(serve: &'c Command, key: &str) -> Option<&'c Arg> {
    if key.contains('-') {
        return None;
    }
    let long = key.replace('_', "-");
    serve
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !NOT_KEYS.contains(&a.get_id().as_str()))
        .find(|a| a.get_long() == Some(long.as_str()))
}

/// The keys of the file: every visible option of `serve`, in its help's
/// order.
pub fn keys(serve: &Command) -> impl Iterator<Item = (String, &Arg)> {
    serve
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !NOT_KEYS.contains(&a.get_id().as_str()))
        .filter_map(|a| Some((a.get_long()?.replace('-', "_"), a)))
}

/// A TOML value as the strings the option's flag would be given.
fn values_of(arg: &Arg, value: &Value) -> Result<Vec<String>, String> {
    let switch = !arg.get_action().takes_values();
    let many = arg.get_num_args().is_some_and(|n| n.max_values() > 1)
        || matches!(arg.get_action(), clap::ArgAction::Append);
    match value {
        Value::Boolean(b) => Ok(vec![b.to_string()]),
        _ if switch => Err(format!("expected true or false, found {}", kind(value))),
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Integer(i) => Ok(vec![i.to_string()]),
        Value::Array(items) if many => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                Value::Integer(i) => Ok(i.to_string()),
                other => Err(format!(
                    "expected strings in the list, found {}",
                    kind(other)
                )),
            })
            .collect(),
        other => Err(format!("expected one value, found {}", kind(other))),
    }
}

/// What kind of TOML value `v` is, for an error.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date",
        Value::Array(_) => "a list",
        Value::Table(_) => "a table",
    }
}

/// Runs the option's own parser on `v`: `jobfence serve --long=v` parsed
/// by `root` (the whole command), refused only for a mistake of this
/// option (an environment variable's mistake is not the file's).
fn check_value(root: &Command, arg: &Arg, v: &str) -> Result<(), String> {
    if !arg.get_action().takes_values() {
        return Ok(());
    }
    let long = format!("--{}", arg.get_long().expect("options have a long name"));
    let argv = [
        "jobfence".to_owned(),
        "serve".to_owned(),
        format!("{long}={v}"),
    ];
    let Err(e) = root.clone().try_get_matches_from(argv) else {
        return Ok(());
    };
    let ours = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(a)) => a.split([' ', '=']).next() == Some(long.as_str()),
        _ => false,
    };
    if !ours {
        return Ok(());
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    Err(first.trim_start_matches("error: ").to_owned())
}

/// Where the value of option `id` came from, for `config check`: a flag,
/// the environment (naming the variable), the file (with its line), the
/// default, or unset.
pub fn source(
    matches: &ArgMatches,
    arg: &Arg,
    file: Option<&ConfigFile>,
    lines: &BTreeMap<String, usize>,
) -> String {
    let id = arg.get_id().as_str();
    match matches.value_source(id) {
        Some(ValueSource::CommandLine) => match (lines.get(id), file) {
            (Some(line), Some(f)) => format!("file {}:{line}", f.path.display()),
            _ => "flag".to_owned(),
        },
        Some(ValueSource::EnvVariable) => format!(
            "environment {}",
            arg.get_env().map_or("".into(), |e| e.to_string_lossy())
        ),
        Some(ValueSource::DefaultValue) => "default".to_owned(),
        _ => "unset".to_owned(),
    }
}

/// `value` of option `key` as `config check` prints it: anything named a
/// password, secret or token (other than a file's name) masked whole, and
/// the password of every URL in any value (a database URL list, an OTLP
/// endpoint) masked.
pub fn masked(key: &str, value: &str) -> String {
    let secret = ["password", "secret", "token"]
        .iter()
        .any(|s| key.contains(s));
    if secret && !key.ends_with("_file") {
        return "****".to_owned();
    }
    mask_url_passwords(value)
}

/// `text` with the password of each `scheme://user:password@…` in it
/// replaced by `****`. Read by hand, not by a URL parser: a password with
/// an unencoded `/`, `#`, `?` or `,` is not a valid URL, and must be masked
/// all the same. A URL's user information ends at the last `@` before the
/// next URL (or the end).
pub fn mask_url_passwords(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(scheme) = rest.find("://") {
        let (head, tail) = rest.split_at(scheme + 3);
        out.push_str(head);
        let end = tail.find("://").map_or(tail.len(), |next| {
            // Back to the start of the next URL's scheme.
            tail[..next]
                .rfind([',', ' ', ';'])
                .map_or(next, |sep| sep + 1)
        });
        let this = &tail[..end];
        match (this.rfind('@'), this.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&this[..colon]);
                out.push_str(":****");
                out.push_str(&this[at..]);
            }
            _ => out.push_str(this),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_toml_is_refused_with_its_line() {
        let e = ConfigFile::parse(Path::new("j.toml"), "listen = \"a\"\n\nlisten = = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("j.toml:3: "), "{e}");
    }

    #[test]
    fn entries_keep_their_lines_in_file_order() {
        let f = ConfigFile::parse(Path::new("j.toml"), "# c\nz = 1\n\na = \"x\"\n").unwrap();
        let got: Vec<_> = f.entries.iter().map(|e| (e.key.as_str(), e.line)).collect();
        assert_eq!(got, [("z", 2), ("a", 4)]);
    }

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            masked("database_url", "mysql://u:pw@h:1/d,mysql://u@h2/d"),
            "mysql://u:****@h:1/d,mysql://u@h2/d"
        );
        assert_eq!(masked("console_token", "abc"), "****");
        assert_eq!(masked("console_token_file", "/etc/t"), "/etc/t");
        assert_eq!(masked("listen", "127.0.0.1:1"), "127.0.0.1:1");
        for (url, shown) in [
            ("mysql://u:Sek/r3t@h1/d", "mysql://u:****@h1/d"),
            ("mysql://u:Sek#r3t@h1/d", "mysql://u:****@h1/d"),
            ("mysql://u:a@b?c@h1:3306/d", "mysql://u:****@h1:3306/d"),
            (
                "mysql://u:p,q@h1/d,mysql://u:x@h2/d",
                "mysql://u:****@h1/d,mysql://u:****@h2/d",
            ),
            (
                "http://otel:tok@collector:4317",
                "http://otel:****@collector:4317",
            ),
            ("mysql://u@h/d", "mysql://u@h/d"),
        ] {
            assert_eq!(masked("database_url", url), shown, "{url}");
        }
    }
}
