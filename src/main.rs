use clap::Parser;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    match jobfence::cli::run(jobfence::cli::Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error and its causes on one line; no backtrace for what
            // is an answer, not a crash.
            eprintln!("jobfence: {e:#}");
            ExitCode::FAILURE
        }
    }
}
