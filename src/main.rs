//! The `jobfence` binary: the command line only. Serving, the operator
//! commands and the credentials are the workspace's crates (see
//! docs/development.md); the demo, the benchmark, the fake provider and
//! the refund worker come with the default feature `tools` (build with
//! `--no-default-features` for a binary that serves and operates only).

mod cli;
mod config_cli;
mod config_file;
mod migrate_cli;
mod restore_cli;
mod retention_cli;
mod security_cli;
mod serve_cli;
mod signal;
mod telemetry;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    jobfence_operator::coordinator_env_alias();
    let args = jobfence_operator::hoist_connection_flags(std::env::args_os().collect());
    // `serve`'s configuration file: its values become flags, below the
    // command line's and the environment's (src/config_file.rs).
    let args = match config_cli::with_config_file(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("jobfence: {e:#}");
            return ExitCode::from(2);
        }
    };
    let cli = cli::Cli::parse_from(args);
    let runtime = match cli.runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jobfence: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        // Its reader went away (`jobfence settlement exceptions | head`):
        // no message, and the status of a Unix filter ended by SIGPIPE
        // (128 + 13), never 0: the command may have been about to report
        // a failure (`settlement report` exits 1 after its text while a
        // critical exception is open), and a pipeline under `set -o
        // pipefail` must not read that as success.
        Err(e) if broken_pipe(&e) => ExitCode::from(141),
        Err(e) => {
            // The error and its causes on one line; no backtrace for what
            // is an answer, not a crash.
            eprintln!("jobfence: {}", one_line(&e));
            ExitCode::from(jobfence_operator::exit_status(&e))
        }
    }
}

/// `e` and its causes joined by `: `, each said once: a cause whose text
/// the one before it already holds is left out (a transport error says
/// "tcp connect error" in two layers of its chain).
fn one_line(e: &anyhow::Error) -> String {
    let mut said: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if said.last().is_some_and(|last| last.contains(&text)) {
            continue;
        }
        said.push(text);
    }
    said.join(": ")
}

/// Whether `e` is a write to standard output whose reader closed it.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// mimalloc: a coordinator allocates and frees small buffers for every
/// call (protobuf messages, rows, HTTP/2 frames); glibc's allocator spent
/// about a tenth of its CPU doing that (`jobfence bench`, perf).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_cause_said_twice_in_a_chain_is_printed_once() {
        let e = anyhow::anyhow!("Connection refused")
            .context("tcp connect error")
            .context("tcp connect error")
            .context("transport error");
        assert_eq!(
            one_line(&e),
            "transport error: tcp connect error: Connection refused"
        );
        let e = anyhow::anyhow!("b").context("a");
        assert_eq!(one_line(&e), "a: b");
    }
}
