//! The command line before clap reads it: the connection flags may come
//! before the command (`jobfence --tls-ca ca.pem stats`) as well as after
//! it, and the coordinator's address has one environment variable for the
//! command line and every client, `JOBFENCE_COORDINATOR` (the old
//! `JOBFENCE_ENDPOINT` still works, with a warning).

use std::ffi::OsString;

/// The operator commands' names (and aliases), as `jobfence` takes them.
const COMMANDS: &[&str] = &[
    "jobs",
    "stats",
    "events",
    "providers",
    "queue-policies",
    "queue-policy",
    "settlement",
    "workers",
];

/// The connection flags ([`crate::Connection`]) that take a value.
const WITH_VALUE: &[&str] = &[
    "--endpoint",
    "--tls-ca",
    "--tls-client-cert",
    "--tls-client-key",
    "--token-file",
];

/// The connection flags that take none.
const SWITCHES: &[&str] = &["--json"];

/// `jobfence`'s own flags before a command that take a value (they stay
/// where they are).
const TOP_WITH_VALUE: &[&str] = &["--log-format", "--worker-threads"];

/// `args` (the program's name first) with the connection flags written
/// before an operator command moved after it, where clap reads them:
/// `jobfence --tls-ca ca.pem stats --json` is read as `jobfence stats
/// --tls-ca ca.pem --json`. Anything else (no operator command, an unknown
/// flag before it) is returned as it is, for clap to accept or refuse.
pub fn hoist_connection_flags(args: Vec<OsString>) -> Vec<OsString> {
    let mut front = Vec::new();
    let mut hoisted = Vec::new();
    let mut i = 1;
    while i < args.len() {
        let Some(arg) = args[i].to_str() else {
            return args;
        };
        if !arg.starts_with("--") {
            break;
        }
        let name = arg.split('=').next().unwrap_or(arg);
        let takes_value = !arg.contains('=');
        let target = if WITH_VALUE.contains(&name) || SWITCHES.contains(&name) {
            &mut hoisted
        } else {
            &mut front
        };
        target.push(args[i].clone());
        if takes_value && (WITH_VALUE.contains(&name) || TOP_WITH_VALUE.contains(&name)) {
            match args.get(i + 1) {
                Some(value) => target.push(value.clone()),
                None => return args,
            }
            i += 1;
        }
        i += 1;
    }
    let is_operator = args
        .get(i)
        .and_then(|a| a.to_str())
        .is_some_and(|a| COMMANDS.contains(&a));
    if hoisted.is_empty() || !is_operator {
        return args;
    }
    let mut out = Vec::with_capacity(args.len());
    out.push(args[0].clone());
    out.extend(front);
    out.push(args[i].clone());
    out.extend(hoisted);
    out.extend(args[i + 1..].iter().cloned());
    out
}

/// Makes the old `JOBFENCE_ENDPOINT` stand for `JOBFENCE_COORDINATOR`
/// when that is not set, and says so on standard error (once, at start,
/// before any thread runs). When both are set, `JOBFENCE_COORDINATOR`
/// wins and the warning says that too.
pub fn coordinator_env_alias() {
    let Some(old) = std::env::var_os("JOBFENCE_ENDPOINT") else {
        return;
    };
    match std::env::var_os("JOBFENCE_COORDINATOR") {
        None => {
            eprintln!(
                "jobfence: JOBFENCE_ENDPOINT is the old name of JOBFENCE_COORDINATOR (the one \
                 the clients read too); it still works, but rename it"
            );
            std::env::set_var("JOBFENCE_COORDINATOR", old);
        }
        Some(new) if new != old => eprintln!(
            "jobfence: JOBFENCE_ENDPOINT ({}) is ignored: JOBFENCE_COORDINATOR ({}) is set",
            old.to_string_lossy(),
            new.to_string_lossy()
        ),
        Some(_) => {}
    }
}

/// A duration flag's value (`90s`, `15m`, `2h`, `7d`, `1h 30m`), with an
/// example of the form in the error clap prints for another.
pub fn duration_arg(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e}: give a duration such as 90s, 15m, 2h or 7d"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hoist(line: &str) -> String {
        let args = line.split(' ').map(OsString::from).collect();
        hoist_connection_flags(args)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn connection_flags_before_an_operator_command_move_after_it() {
        assert_eq!(
            hoist("jobfence --tls-ca ca.pem stats"),
            "jobfence stats --tls-ca ca.pem"
        );
        assert_eq!(
            hoist("jobfence --json --endpoint=https://h:1 jobs list --queue q"),
            "jobfence jobs --json --endpoint=https://h:1 list --queue q"
        );
        assert_eq!(
            hoist("jobfence --log-format json --token-file t settlement report"),
            "jobfence --log-format json settlement --token-file t report"
        );
    }

    #[test]
    fn anything_else_is_left_for_clap() {
        for line in [
            "jobfence stats --tls-ca ca.pem",
            "jobfence --tls-ca ca.pem serve",
            "jobfence --tls-ca",
            "jobfence --unknown stats",
            "jobfence --log-format json migrate",
        ] {
            assert_eq!(hoist(line), line);
        }
    }

    #[test]
    fn a_bad_duration_says_what_a_good_one_looks_like() {
        assert_eq!(
            duration_arg("2h").unwrap(),
            std::time::Duration::from_secs(7200)
        );
        let e = duration_arg("yesterday").unwrap_err();
        assert!(
            e.ends_with("give a duration such as 90s, 15m, 2h or 7d"),
            "{e}"
        );
    }
}
