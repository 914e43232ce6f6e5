//! The `jobfence` command line. Every flag can also be set by the
//! `JOBFENCE_*` environment variable named in its help.
//!
//! Here: the commands, the database flags, `migrate`, and the dispatch to
//! each command's own module (`serve` in src/serve_cli.rs, `prune` in
//! src/retention_cli.rs, `restore` in src/restore_cli.rs, `credentials`
//! in src/security_cli.rs, the operator commands in the crate
//! jobfence-operator).

use crate::migrate_cli::{migrate, migrate_all, process_name, refusing, MigrateArgs};
use crate::restore_cli::RestoreArgs;
use crate::retention_cli::{prune, PruneArgs};
use crate::security_cli::CredentialsArgs;
use crate::serve_cli::{serve, ServeArgs};
use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use jobfence_domain::CoordinatorError;
use jobfence_operator::{self as admin_cli, Operation};
use jobfence_store::shards::{Shards, ShardsConfig};
use jobfence_store::{JobStore, PoolSettings};
use std::process::ExitCode;
use std::time::Duration;

/// The database of the project-local MariaDB that `scripts/mariadb` starts,
/// on its first port.
pub const DEFAULT_DATABASE_URL: &str = "mysql://jobfence:jobfence@127.0.0.1:3307/jobfence";

/// The default `--database-url`: the project-local MariaDB of the checkout
/// the command runs in, on the port `scripts/mariadb` remembered for it
/// (`.local/mariadb/port` in this directory or the nearest one above it
/// that has one); [`DEFAULT_DATABASE_URL`] where none is found. So a bare
/// `jobfence prune` in one checkout never reaches another checkout's
/// database on the default port.
pub fn default_database_url() -> String {
    let Ok(here) = std::env::current_dir() else {
        return DEFAULT_DATABASE_URL.to_owned();
    };
    for dir in here.ancestors() {
        let Ok(text) = std::fs::read_to_string(dir.join(".local/mariadb/port")) else {
            continue;
        };
        return match text.trim().parse::<u16>() {
            Ok(port) => format!("mysql://jobfence:jobfence@127.0.0.1:{port}/jobfence"),
            Err(_) => DEFAULT_DATABASE_URL.to_owned(),
        };
    }
    DEFAULT_DATABASE_URL.to_owned()
}

/// The parser of a count that must be at least 1 (a pool, a batch, a
/// limit of 0 would serve nothing, or panic).
pub fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}

#[derive(Debug, Parser)]
#[command(
    name = "jobfence",
    version = env!("JOBFENCE_VERSION"),
    long_version = env!("JOBFENCE_LONG_VERSION"),
    about = "Fenced job coordination over MySQL, served over gRPC",
    after_help = "The operator commands' connection flags (--endpoint or JOBFENCE_COORDINATOR, \
                  --tls-ca, --token-file, --json, …) go before or after the command: \
                  `jobfence --tls-ca ca.pem stats` is `jobfence stats --tls-ca ca.pem`."
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "JOBFENCE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Threads running the async work. 1 (the default) runs everything on
    /// one thread: a coordinator mostly waits for the database, and on a
    /// small machine (or a VM) handing each call between threads costs more
    /// CPU than the call itself. Raise it when that one thread is busy
    /// (its CPU near 100 %).
    #[arg(
        long,
        global = true,
        env = "JOBFENCE_WORKER_THREADS",
        default_value_t = 1
    )]
    pub worker_threads: usize,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

// One value per process, parsed once: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the JobCoordinator gRPC API (with health and reflection).
    Serve(ServeArgs),
    /// `serve`'s configuration file: check one (the configuration it gives,
    /// with where each value came from), or print an example
    /// (docs/configuration.md).
    Config(crate::config_cli::ConfigArgs),
    /// Apply the schema migrations and exit, saying what each database
    /// got; `--check` applies nothing and says whether this binary may
    /// serve each database, `--dry-run` what it would apply, `migrate
    /// status` every migration, applied or pending.
    Migrate(MigrateArgs),
    /// Prune finished jobs past their retention once, with their
    /// observations and events, keeping their operation keys (for cron;
    /// `serve` also prunes on an interval). Prints a progress line per
    /// batch; exit status 0 when every database was pruned, 2 when another
    /// coordinator was pruning one (it was left to it), 1 on an error.
    Prune(PruneArgs),
    /// After a database was restored from a backup: `restore fence` moves
    /// every unfinished job to a new attempt above any handed out since
    /// the backup (docs/operating.md, "Backup and restore").
    Restore(RestoreArgs),
    #[cfg(feature = "tools")]
    /// Serve a fake Stripe-style refund API with fault injection, for the
    /// demo and tests (see docs/fake-provider.md).
    FakeProvider(jobfence_fake_provider::cli::FakeProviderArgs),
    #[cfg(feature = "tools")]
    /// The main job: coordinators behind HAProxy (TLS and tokens on), a
    /// fake provider, Rust, Python, Node and Go refund workers, injected
    /// failures, and a report checked against the provider's ledger (exit
    /// status 1 if the invariant is violated).
    Demo(jobfence_tools::demo::DemoArgs),
    #[cfg(feature = "tools")]
    /// A refund worker: claims refunds and sends them to the provider.
    RefundWorker(jobfence_tools::refund_worker::RefundWorkerArgs),
    /// The operator commands (jobs, stats, events, providers,
    /// queue-policies, settlement): the crate jobfence-operator.
    #[command(flatten)]
    Operator(Operation),
    /// Issue credentials: a bearer token and its callers-file line, or a
    /// throw-away development CA with tokens (see docs/security.md).
    Credentials(CredentialsArgs),
    #[cfg(feature = "tools")]
    /// Measure the coordinator against workers running the SQL themselves,
    /// side by side on one database (see docs/benchmarks.md). A flag given
    /// twice takes its last value (scripts/bench passes defaults first).
    #[command(args_override_self = true)]
    Bench(jobfence_tools::bench::BenchArgs),
}

#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// The configuration file (TOML, one key per option of `jobfence serve
    /// --help`: its long name with _ for -). Flags and JOBFENCE_* variables
    /// win over it. By default /etc/jobfence/jobfence.toml when it exists.
    /// `serve` takes every key; `migrate`, `prune` and `restore fence` take
    /// the keys that are options of theirs (the database, retention), so
    /// they reach the database the coordinators use. `jobfence config check
    /// FILE` shows what it gives.
    #[arg(long, env = "JOBFENCE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// MySQL/MariaDB URL; several, comma-separated, for the nodes of one
    /// Galera cluster in order of preference: the coordinator writes
    /// through the first node that is ready, moves to the next when that
    /// one stops answering or leaves the primary component, and back when
    /// it is synced again (docs/database.md). By default the MariaDB that
    /// `scripts/mariadb` started for this checkout, on the port it
    /// remembered (`.local/mariadb/port`), else port 3307.
    #[arg(long, env = "JOBFENCE_DATABASE_URL", default_value_t = default_database_url())]
    pub database_url: String,
    /// Spread queues over several databases: a file listing the databases
    /// (each one URL, or a Galera cluster's node URLs) and which queue
    /// lives on which (see docs/database.md, "Queues on several
    /// databases"). Replaces --database-url.
    #[arg(long, env = "JOBFENCE_SHARDS")]
    pub shards: Option<std::path::PathBuf>,
    /// `wsrep_sync_wait` of every session on a Galera node (ignored
    /// elsewhere): 1 makes every read wait until the node has applied what
    /// the cluster committed before it; 0 turns that off (docs/database.md,
    /// "Reads after writes").
    #[arg(long, env = "JOBFENCE_GALERA_SYNC_WAIT", default_value_t = 1)]
    pub galera_sync_wait: u8,
    /// Most database connections.
    #[arg(long, env = "JOBFENCE_DB_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..), default_value_t = 32)]
    pub db_max_connections: u32,
    /// How long a call waits for a database connection before it is
    /// answered UNAVAILABLE / DATABASE_UNAVAILABLE (nothing applied): while
    /// the database is down, calls fail this fast instead of hanging.
    #[arg(long, env = "JOBFENCE_DB_ACQUIRE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "1s")]
    pub db_acquire_timeout: Duration,
    /// A file whose first line is the database password, used for every
    /// database URL (the shards file's too): keeps the password out of the
    /// URL, the environment and the process list. Refused beside a URL
    /// that has a password of its own.
    #[arg(long, env = "JOBFENCE_DATABASE_PASSWORD_FILE")]
    pub database_password_file: Option<std::path::PathBuf>,
}

impl DatabaseArgs {
    /// `url` with the password of `--database-password-file`, if given.
    fn with_password(&self, url: &str) -> anyhow::Result<String> {
        let Some(path) = &self.database_password_file else {
            return Ok(url.to_owned());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the database password file {}", path.display()))?;
        let password = text.lines().next().unwrap_or_default();
        anyhow::ensure!(
            !password.is_empty(),
            "the database password file {} is empty",
            path.display()
        );
        let mut parsed = url::Url::parse(url).with_context(|| {
            format!(
                "the database URL {:?} is not a URL",
                crate::config_file::mask_url_passwords(url)
            )
        })?;
        anyhow::ensure!(
            parsed.password().is_none(),
            "--database-password-file is given and a database URL has a password of its own: \
             give it in one place"
        );
        parsed
            .set_password(Some(password))
            .map_err(|()| anyhow::anyhow!("the database URL cannot carry a password"))?;
        Ok(parsed.to_string())
    }
}

/// The databases the flags name: the shards file's, or `--database-url`
/// alone (database 0). Connects lazily; checks nothing yet. Each session
/// registers as `process`'s (see `PoolSettings::process`).
pub fn open_shards(db: &DatabaseArgs, process: Option<String>) -> anyhow::Result<Shards> {
    let settings = PoolSettings {
        max_connections: db.db_max_connections,
        acquire_timeout: db.db_acquire_timeout,
        galera_sync_wait: db.galera_sync_wait,
        process,
    };
    let Some(path) = &db.shards else {
        let urls = split_urls(&db.database_url)
            .iter()
            .map(|u| db.with_password(u))
            .collect::<anyhow::Result<Vec<_>>>()?;
        return Ok(Shards::single(JobStore::open(&urls, &settings)?));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the shards file {}", path.display()))?;
    let config = ShardsConfig::parse(&text)
        .map_err(|e| anyhow::anyhow!("shards file {}: {e}", path.display()))?;
    let mut stores = std::collections::BTreeMap::new();
    for (n, urls) in config.databases {
        let urls = urls
            .iter()
            .map(|u| db.with_password(u))
            .collect::<anyhow::Result<Vec<_>>>()?;
        stores.insert(n, JobStore::open(&urls, &settings)?);
    }
    Ok(Shards::new(stores, config.placement))
}

/// A comma-separated URL list.
fn split_urls(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Migrates every database (with `migrate`), then checks each one's
/// schema (see `Shards::check_schemas`: a coordinator never serves a
/// schema it does not know) and number (see `Shards::prepare`: one
/// database alone must be database 0).
///
/// With `serving`, one database used alone that does not answer yet is
/// left to be checked when it does (as before numbers were checked, a
/// coordinator starts while its only database is down, NOT_SERVING until
/// the checks pass): returns true then, for
/// [`jobfence_server::OpsOptions::check_shard_numbers`].
pub async fn prepare(shards: &Shards, migrate: bool, serving: bool) -> anyhow::Result<bool> {
    if migrate {
        migrate_all(shards, false).await?;
    }
    match shards.prepare().await {
        Ok(()) => Ok(false),
        Err(
            e @ (CoordinatorError::DatabaseUnavailable(_)
            | CoordinatorError::TransactionConflict(_)
            | CoordinatorError::CommitOutcomeUnknown(_)),
        ) if serving && !shards.is_sharded() => {
            tracing::warn!(
                error = %e,
                "the database's schema and shard number could not be read now (the database is down or busy): they are checked when it does answer"
            );
            Ok(true)
        }
        Err(e) => Err(refusing(e).context("checking the databases")),
    }
}

impl Cli {
    /// The Tokio runtime the command runs on (see `--worker-threads`).
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        if self.worker_threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(self.worker_threads)
                .enable_all()
                .build()
        }
    }
}

/// Runs the command line; the exit status is the command's answer (the
/// demo exits 1 when its invariant check fails), an error is printed by
/// `main`.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // Operator commands print to stdout and log nothing.
    let operation = match cli.command {
        Command::Operator(op) => op,
        Command::Credentials(a) => return crate::security_cli::run(a).map(|()| ExitCode::SUCCESS),
        Command::Config(a) => {
            crate::config_cli::run(a, &mut std::io::stdout())?;
            return Ok(ExitCode::SUCCESS);
        }
        server_command => {
            let otlp_endpoint = match &server_command {
                Command::Serve(args) => args.otlp_endpoint.clone(),
                _ => None,
            };
            let telemetry = crate::telemetry::init(cli.log_format, otlp_endpoint.as_deref())?;
            let answer = run_server(server_command).await;
            // After the drain: the spans of the last calls are sent too.
            telemetry.shutdown().await;
            return answer;
        }
    };
    admin_cli::run(operation, &mut std::io::stdout()).await?;
    Ok(ExitCode::SUCCESS)
}

/// Runs a command that serves or works on the databases (and the tools'
/// commands); the exit status is its answer.
async fn run_server(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Migrate(args) => migrate(args).await?,
        Command::Prune(args) => return prune_once(args).await,
        Command::Restore(args) => crate::restore_cli::run(args).await?,
        Command::Serve(args) => serve(args).await?,
        Command::Operator(_) | Command::Credentials(_) | Command::Config(_) => {
            unreachable!("operator commands are run by admin_cli")
        }
        #[cfg(feature = "tools")]
        Command::FakeProvider(args) => args.run(crate::signal::shutdown_signal()).await?,
        #[cfg(feature = "tools")]
        Command::RefundWorker(args) => args.run(crate::signal::shutdown_signal()).await?,
        #[cfg(feature = "tools")]
        Command::Bench(args) => jobfence_tools::bench::run(args).await?,
        #[cfg(feature = "tools")]
        Command::Demo(args) => {
            // The report is printed; a violated invariant is the exit
            // status, returned (not `process::exit`) so that the runtime
            // and the demo's children are dropped and stopped first.
            if !jobfence_tools::demo::run(args, crate::signal::shutdown_signal()).await? {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `jobfence prune`: the retention settings checked, the databases
/// checked, then one pruning run.
async fn prune_once(args: PruneArgs) -> anyhow::Result<ExitCode> {
    let settings = args.retention.settings(Duration::ZERO)?;
    let shards = open_shards(&args.database, Some(process_name("prune")))?;
    prepare(&shards, false, false).await?;
    prune(shards, settings).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_commands_are_the_binarys_own() {
        // Flattened from jobfence-operator: parsed as before, with the
        // connection's flags after the subcommand.
        let cli = Cli::try_parse_from([
            "jobfence",
            "jobs",
            "list",
            "--endpoint",
            "127.0.0.1:1",
            "--json",
        ])
        .unwrap();
        match cli.command {
            Command::Operator(Operation::Jobs(a)) => {
                assert_eq!(a.conn.endpoint, "127.0.0.1:1");
                assert!(a.conn.json);
            }
            other => panic!("not jobs: {other:?}"),
        }
        let cli = Cli::try_parse_from(["jobfence", "queue-policy", "list"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Operator(Operation::QueuePolicies(_))
        ));
    }

    #[test]
    fn migrate_takes_its_flags_or_its_status_subcommand() {
        use crate::migrate_cli::MigrateCommand;
        let parse = |args: &[&str]| Cli::try_parse_from([&["jobfence"][..], args].concat());
        for (args, check, dry_run) in [
            (&["migrate"][..], false, false),
            (&["migrate", "--check"][..], true, false),
            (
                &["migrate", "--dry-run", "--database-url", "mysql://x/y"][..],
                false,
                true,
            ),
        ] {
            match parse(args).unwrap().command {
                Command::Migrate(m) => {
                    assert!(m.command.is_none(), "{args:?}");
                    assert_eq!((m.check, m.dry_run), (check, dry_run), "{args:?}");
                }
                other => panic!("not migrate: {other:?}"),
            }
        }
        match parse(&["migrate", "status", "--database-url", "mysql://x/y"])
            .unwrap()
            .command
        {
            Command::Migrate(m) => match m.command {
                Some(MigrateCommand::Status(s)) => {
                    assert_eq!(s.database.database_url, "mysql://x/y")
                }
                None => panic!("no status"),
            },
            other => panic!("not migrate: {other:?}"),
        }
        assert!(parse(&["migrate", "--check", "--dry-run"]).is_err());
        assert!(parse(&["migrate", "--check", "status"]).is_err());
        assert!(parse(&["restore", "fence", "--yes", "--batch", "10"]).is_ok());
    }
}
