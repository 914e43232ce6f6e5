//! `jobfence settlement configure|import|report|exceptions` (docs/design.md
//! rule 15, docs/settlement.md): how a provider's report is
//! read, importing one, the provider's settlement at a glance (exit status
//! 1 while a critical exception is open, 2 when it cannot be read: see
//! [`ReportVerdict`]), and the exceptions with
//! a person's action on one.

mod import;
mod progress;
mod read;
mod report;

pub use import::ImportArgs;
pub use report::ReportVerdict;

use crate::changes::ChangeArgs;
use crate::connection::{channel, Connection};
use crate::duration;
use crate::refusal::{refused_with_flags, FlagNames};
use clap::{Args, Subcommand};
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use std::io::Write;
use std::time::Duration;

/// `jobfence settlement …`
#[derive(Debug, Args)]
pub struct SettlementArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: SettlementCommand,
}

/// The `settlement` subcommands.
#[derive(Debug, Subcommand)]
pub enum SettlementCommand {
    /// Store how a provider's report is read: a preset (fake, stripe) or
    /// its columns, the lag before a missing refund is an exception, and
    /// where each of its queues keeps a job's amount.
    Configure(ConfigureArgs),
    /// Import a provider's report (CSV or JSON lines, gzip accepted),
    /// streamed to the coordinator; prints what it matched and raised.
    Import(ImportArgs),
    /// Each provider's settlement: periods covered, lines, matches, reviews
    /// resolved, exceptions. Exits 1 while a critical exception is open.
    Report {
        /// Only this provider.
        #[arg(long)]
        provider: Option<String>,
    },
    /// List exceptions, show one with its life, or act on one.
    Exceptions(ExceptionsArgs),
}

/// `jobfence settlement configure`.
#[derive(Debug, Args)]
pub struct ConfigureArgs {
    /// The provider (it must exist: `jobfence providers set`).
    #[arg(long)]
    pub provider: String,
    /// fake (the fake provider's CSV export) or stripe (Refund objects as
    /// JSON lines); or give every --column.
    #[arg(long)]
    pub preset: Option<String>,
    /// A report column, as FIELD=COLUMN, for each of provider_reference,
    /// operation_key, amount, currency, status, created (over a preset's).
    #[arg(long = "column", value_parser = key_value)]
    pub columns: Vec<(String, String)>,
    /// minor (integers in the currency's minor unit) or major (decimals).
    #[arg(long)]
    pub amount_unit: Option<String>,
    /// unix (seconds) or rfc3339.
    #[arg(long)]
    pub created_format: Option<String>,
    /// How long after a job succeeded its refund may still be missing
    /// from the reports (default 24h).
    #[arg(long, value_parser = crate::args::duration_arg)]
    pub lag: Option<Duration>,
    /// Where a queue keeps a job's amount and currency in its payload, as
    /// QUEUE=/amount,/currency (JSON pointers); one per queue.
    #[arg(long = "amounts", value_parser = key_value)]
    pub amounts: Vec<(String, String)>,
    #[command(flatten)]
    pub change: ChangeArgs,
}

/// `jobfence settlement exceptions …`
#[derive(Debug, Args)]
pub struct ExceptionsArgs {
    /// What to do (list when left out).
    #[command(subcommand)]
    pub command: Option<ExceptionsCommand>,
    /// Only this provider's.
    #[arg(long)]
    pub provider: Option<String>,
    /// Only in these states (open, acknowledged, resolved; default open
    /// and acknowledged).
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<String>,
    /// Only this job's.
    #[arg(long)]
    pub job: Option<u64>,
    /// At most this many, 1 to 500; 0 for as many as one list shows
    /// (500). A list the limit cut says so: how many it shows of how many
    /// match.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=500))]
    pub limit: u32,
}

/// The `settlement exceptions` subcommands.
#[derive(Debug, Subcommand)]
pub enum ExceptionsCommand {
    /// One exception with every step of its life.
    Show { id: u64 },
    /// Say someone is on it (recorded with your name and note).
    Ack(ActArgs),
    /// Close it (recorded with your name and note).
    Resolve(ActArgs),
}

/// An action on one exception.
#[derive(Debug, Args)]
pub struct ActArgs {
    /// The exception.
    pub id: u64,
    /// What was done, or found; recorded.
    #[arg(long)]
    pub note: String,
    /// Your name (a coordinator that authenticates records your
    /// credential's name).
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .ok_or_else(|| format!("{s:?}: expected NAME=VALUE"))
}

/// The flags of `settlement configure`'s fields.
const CONFIGURE_FLAGS: &FlagNames = &[
    ("provider", "--provider"),
    ("preset", "--preset"),
    ("columns.", "--column"),
    ("lag", "--lag"),
    ("queues[", "--amounts"),
    ("operator", "--operator"),
    ("reason", "--reason"),
];

/// Runs `settlement …`, printing to `out`.
pub(crate) async fn run(args: SettlementArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let conn = args.conn;
    match args.command {
        SettlementCommand::Import(a) => import::run(&conn, a, out).await,
        SettlementCommand::Configure(a) => configure(&conn, a, out).await,
        SettlementCommand::Report { provider } => report::run(&conn, provider, out).await,
        SettlementCommand::Exceptions(a) => report::exceptions(&conn, a, out).await,
    }
}

async fn configure(
    conn: &Connection,
    a: ConfigureArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let mut columns = proto::SettlementColumns {
        amount_unit: a.amount_unit.clone().unwrap_or_default(),
        created_format: a.created_format.clone().unwrap_or_default(),
        ..Default::default()
    };
    for (field, column) in &a.columns {
        let slot = match field.as_str() {
            "provider_reference" => &mut columns.provider_reference,
            "operation_key" => &mut columns.operation_key,
            "amount" => &mut columns.amount,
            "currency" => &mut columns.currency,
            "status" => &mut columns.status,
            "created" => &mut columns.created,
            other => anyhow::bail!(
                "--column {other}=…: the fields are provider_reference, operation_key, amount, \
                 currency, status, created"
            ),
        };
        *slot = column.clone();
    }
    let mut queues = Vec::new();
    for (queue, pointers) in &a.amounts {
        let (amount, currency) = pointers.split_once(',').ok_or_else(|| {
            anyhow::anyhow!("--amounts {queue}={pointers}: expected QUEUE=/amount,/currency")
        })?;
        queues.push(proto::QueueAmountPointers {
            queue: queue.clone(),
            amount_pointer: amount.trim().to_owned(),
            currency_pointer: currency.trim().to_owned(),
        });
    }
    let mut client = JobAdminClient::new(channel(conn).await?);
    let done = client
        .put_settlement_settings(proto::PutSettlementSettingsRequest {
            provider: a.provider,
            preset: a.preset.unwrap_or_default(),
            columns: Some(columns),
            lag: a.lag.map(duration),
            queues,
            operator: a.change.operator,
            reason: a.change.reason,
        })
        .await
        .map_err(|s| refused_with_flags(s, CONFIGURE_FLAGS))?
        .into_inner();
    report::settings(out, done.settings.as_ref(), conn.json)
}
