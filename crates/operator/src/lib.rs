//! The operator's command line, a gRPC client of a running coordinator
//! (it depends on the API and the worker SDK's credentials, nothing of the
//! coordinator): `jobfence jobs list|show|resolve|cancel`,
//! `jobfence stats`, `jobfence events list|watch`, `jobfence providers
//! list|set|delete|pause|resume|history`, `jobfence queue-policies
//! list|set|delete|history` and `jobfence settlement
//! configure|import|report|exceptions` and `jobfence workers`. They talk gRPC to a running coordinator
//! (JobAdmin, JobEvents), print human-readable tables by default and JSON
//! with `--json`. A refusal is printed with its ErrorInfo reason and
//! metadata (and each bad field, named by its flag where there is one) and
//! makes the command exit non-zero.
//!
//! One module per command group, each with its flags, its calls and what
//! it prints: [`jobs`](JobsArgs), [`stats`](StatsArgs),
//! [`events`](EventsArgs), [`providers`](ProvidersArgs) and
//! [`queue-policies`](QueuePoliciesArgs); the changes both of the last two
//! record ([`ChangeArgs`], [`HistoryArgs`]). Shared: the connection flags
//! ([`Connection`]), the refusal as printed ([`describe_status`]) and the
//! tables and JSON every command prints with.

mod args;
mod bulk;
mod changes;
mod connection;
mod enqueue;
mod events;
mod jobs;
mod pace;
mod providers;
mod queue_policies;
mod refusal;
mod render;
mod settlement;
mod stats;
mod workers;

pub use args::{coordinator_env_alias, hoist_connection_flags};
pub use bulk::{Bulk, BulkAction, BulkArgs, BulkTally, Selected};
pub use changes::{ChangeArgs, HistoryArgs};
pub use connection::{read_token, Connection};
pub use enqueue::EnqueueArgs;
pub use events::{EventsArgs, EventsCommand};
pub use jobs::{
    CancelArgs, JobsArgs, JobsCommand, ListArgs, ResolveArgs, ResolveTo, RetryArgs, StateArg,
};
pub use providers::{ProvidersArgs, ProvidersCommand, SetProviderArgs};
pub use queue_policies::{QueuePoliciesArgs, QueuePoliciesCommand};
pub use refusal::{describe_status, describe_status_with_flags};
pub use settlement::{ReportVerdict, SettlementArgs, SettlementCommand};
pub use stats::StatsArgs;
pub use workers::WorkersArgs;

use clap::{Parser, Subcommand};
use std::io::Write;
use std::time::Duration;

/// One operator command: the subcommands `jobfence` takes for them (the
/// binary flattens this enum into its own).
// One value per process, parsed once: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Operation {
    /// Operator: list, show, resolve or cancel jobs of a running coordinator.
    Jobs(JobsArgs),
    /// Operator: per-queue counts, oldest pending ages, takeovers and
    /// stale-write rejections.
    Stats(StatsArgs),
    /// Read the events feed (the outbox) by cursor.
    Events(EventsArgs),
    /// Operator: provider budgets (rate, burst, in-flight cap, costs), the
    /// queues they govern, pauses during a provider incident, and the
    /// record of every change.
    Providers(ProvidersArgs),
    /// Operator: queues' stored resend policies (resend window, max
    /// dispatches), which win over every coordinator's flags.
    #[command(visible_alias = "queue-policy")]
    QueuePolicies(QueuePoliciesArgs),
    /// Operator: the provider's settlement reports (docs/design.md rule 15):
    /// how one is read, importing one, the report of what matched, and the
    /// exceptions for a person.
    Settlement(SettlementArgs),
    /// Operator: the workers seen by any coordinator, live or stale, with
    /// their client, calls per minute and the jobs they hold.
    Workers(WorkersArgs),
}

/// The operator commands alone, parsed as `jobfence` parses them
/// (`jobfence jobs list --endpoint …`): for a program or a test that runs
/// one in-process with [`run`].
#[derive(Debug, Parser)]
#[command(name = "jobfence")]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Operation,
}

/// Runs one operator command, printing to `out`.
pub async fn run(op: Operation, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    match op {
        Operation::Jobs(args) => jobs::run(args, out).await,
        Operation::Stats(args) => stats::run(args, out).await,
        Operation::Events(args) => events::run(args, out).await,
        Operation::Providers(args) => providers::run(args, out).await,
        Operation::QueuePolicies(args) => queue_policies::run(args, out).await,
        Operation::Settlement(args) => settlement::run(args, out).await,
        Operation::Workers(args) => workers::run(args, out).await,
    }
}

/// The exit status of an operator command that failed with `err`: the
/// status `settlement report` chose ([`ReportVerdict`]), else 1.
pub fn exit_status(err: &anyhow::Error) -> u8 {
    err.downcast_ref::<ReportVerdict>()
        .map_or(1, ReportVerdict::exit_status)
}

/// A duration on the command line as the API carries it.
fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}
