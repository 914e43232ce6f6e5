use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    jobfence::cli::run(jobfence::cli::Cli::parse()).await
}
