//! The operator commands run in this process against a secure harness,
//! as a user runs them: shared by the tests that check what they print.

use jobfence_testkit::secure::Secure;

/// `jobfence ARGS…` (an operator command) as `caller`, through TLS with
/// `caller`'s token, the connection flags written first and moved where
/// clap reads them as the binary does: what it printed, and its error
/// with every cause (`{:#}`) if it failed.
pub(crate) async fn run_as(
    s: &Secure,
    caller: &str,
    args: &[&str],
) -> (String, Result<(), String>) {
    use clap::Parser;
    let endpoint = format!("https://{}", s.addr);
    let ca = s.files.ca.display().to_string();
    let token = s.files.token(caller).display().to_string();
    let flags = [
        "--endpoint",
        &endpoint,
        "--tls-ca",
        &ca,
        "--token-file",
        &token,
    ];
    let argv: Vec<std::ffi::OsString> = std::iter::once("jobfence")
        .chain(flags)
        .chain(args.iter().copied())
        .map(Into::into)
        .collect();
    let argv = jobfence_operator::hoist_connection_flags(argv);
    let op = jobfence_operator::Cli::try_parse_from(argv)
        .unwrap()
        .command;
    let mut out = Vec::new();
    let done = jobfence_operator::run(op, &mut out).await;
    let printed = String::from_utf8(out).unwrap();
    (printed, done.map_err(|e| format!("{e:#}")))
}
