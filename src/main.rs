use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = jobfence::cli::Cli::parse();
    let runtime = match cli.runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jobfence: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(jobfence::cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error and its causes on one line; no backtrace for what
            // is an answer, not a crash.
            eprintln!("jobfence: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// mimalloc: a coordinator allocates and frees small buffers for every
/// call (protobuf messages, rows, HTTP/2 frames); glibc's allocator spent
/// about a tenth of its CPU doing that (`jobfence bench`, perf).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
