//! The operator's command line, a gRPC client of a running coordinator
//! (it depends on the API and the worker SDK's credentials, nothing of the
//! coordinator): `jobfence jobs list|show|resolve|cancel`,
//! `jobfence stats`, `jobfence events list|watch`, `jobfence providers
//! list|set|delete|pause|resume|history` and `jobfence queue-policies
//! list|set|delete|history`. They talk gRPC to a running coordinator
//! (JobAdmin, JobEvents), print human-readable tables by default and JSON
//! with `--json`. A refusal is printed with its ErrorInfo reason and
//! metadata (and each bad field, named by its flag where there is one) and
//! makes the command exit non-zero.

mod render;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::job_events_client::JobEventsClient;
use jobfence_api::v1::{self as proto, Resolution};
use jobfence_worker::credentials::{Authorization, BearerToken, Credentials};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// Where the coordinator is, and how to print. Both flags are global to
/// their command group, so `jobfence jobs list --endpoint …` works as well
/// as `jobfence jobs --endpoint … list` and `jobfence stats --endpoint …`.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The coordinator's gRPC address.
    #[arg(
        long,
        global = true,
        env = "JOBFENCE_ENDPOINT",
        default_value = "http://127.0.0.1:50051"
    )]
    pub endpoint: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true, env = "JOBFENCE_JSON", default_value_t = false)]
    pub json: bool,
    /// The CA certificate (PEM) that signed the coordinator's: speak TLS.
    #[arg(long, global = true, env = "JOBFENCE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM), for mutual TLS; with --tls-client-key.
    #[arg(
        long,
        global = true,
        env = "JOBFENCE_TLS_CLIENT_CERT",
        requires = "tls_client_key"
    )]
    pub tls_client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        global = true,
        env = "JOBFENCE_TLS_CLIENT_KEY",
        requires = "tls_client_cert"
    )]
    pub tls_client_key: Option<PathBuf>,
    /// A file whose first line is your bearer token (an operator's for
    /// `jobs`, `stats`, `providers` and `queue-policies`, an
    /// events-reader's for `events`).
    #[arg(long, global = true, env = "JOBFENCE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

/// `jobfence jobs …`
#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: JobsCommand,
}

/// The `jobs` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Jobs by queue, state and age, oldest first.
    List(ListArgs),
    /// One job with its observations and events.
    Show {
        /// The job id.
        job_id: u64,
    },
    /// Resolve a job parked in manual review (fenced on the attempt you saw).
    Resolve(ResolveArgs),
    /// Cancel a ready job that was never dispatched.
    Cancel(CancelArgs),
}

/// Filters of `jobs list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only these states (repeatable).
    #[arg(long = "state", value_enum)]
    pub states: Vec<StateArg>,
    /// Only jobs created at least this long ago (e.g. 30m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub older_than: Option<Duration>,
    /// Jobs per page (1..=500).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Continue after a previous page (its next page token).
    #[arg(long)]
    pub page_token: Option<String>,
}

/// A job state on the command line (`manual-review` for manual_review).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    Ready,
    Running,
    Succeeded,
    Failed,
    ManualReview,
    Cancelled,
}

impl StateArg {
    fn to_proto(self) -> proto::JobState {
        match self {
            StateArg::Ready => proto::JobState::Ready,
            StateArg::Running => proto::JobState::Running,
            StateArg::Succeeded => proto::JobState::Succeeded,
            StateArg::Failed => proto::JobState::Failed,
            StateArg::ManualReview => proto::JobState::ManualReview,
            StateArg::Cancelled => proto::JobState::Cancelled,
        }
    }
}

/// Where `jobs resolve` sends the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResolveTo {
    /// Confirmed succeeded at the provider (needs --provider-reference).
    Succeeded,
    /// Confirmed not done, never to be done.
    Failed,
    /// Back to ready; the next worker reconciles first.
    RetryReconcile,
    /// Back to ready; the next worker sends again (needs --authorize-resend).
    RetryExecute,
}

/// Arguments of `jobs resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// The parked job.
    pub job_id: u64,
    /// The attempt you saw on the parked job (`jobs show`).
    #[arg(long)]
    pub attempt: u64,
    /// Where the job goes.
    #[arg(long, value_enum)]
    pub to: ResolveTo,
    /// Your name, recorded in the event. A coordinator that authenticates
    /// records your credential's name instead: leave this out, or give
    /// that same name (another is refused, OPERATOR_MISMATCH).
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
    /// Why; recorded in the event.
    #[arg(long)]
    pub reason: String,
    /// The provider's reference (for --to succeeded).
    #[arg(long)]
    pub provider_reference: Option<String>,
    /// The provider's result text (for --to succeeded).
    #[arg(long)]
    pub result: Option<String>,
    /// For the retries: delay before the job is due again (e.g. 5m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub delay: Option<Duration>,
    /// Required for --to retry-execute: you accept that the provider may no
    /// longer de-duplicate the resend.
    #[arg(long, default_value_t = false)]
    pub authorize_resend: bool,
}

/// Arguments of `jobs cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The job to cancel.
    pub job_id: u64,
    /// The attempt you saw (0 for a job never claimed).
    #[arg(long, default_value_t = 0)]
    pub attempt: u64,
    /// Your name, as for `jobs resolve`.
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
    /// Why; recorded in the event.
    #[arg(long)]
    pub reason: String,
}

/// `jobfence stats`
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Window of the takeover and rejection counts.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    pub window: Duration,
}

/// `jobfence events …`
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: EventsCommand,
}

/// The `events` subcommands.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// One page of events after a cursor.
    List {
        /// Events after this event id.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// At most this many events (1..=1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Replay from a cursor, then follow new events (Ctrl-C to stop).
    Watch {
        /// Events after this event id.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
}

/// `jobfence providers …`
#[derive(Debug, Args)]
pub struct ProvidersArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: ProvidersCommand,
}

/// Who changes a provider or a policy, and why (both recorded).
#[derive(Debug, Args)]
pub struct ChangeArgs {
    /// Your name, recorded with the change. A coordinator that
    /// authenticates records your credential's name instead: leave this
    /// out, or give that same name (another is refused, OPERATOR_MISMATCH).
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
    /// Why; recorded with the change.
    #[arg(long)]
    pub reason: String,
}

/// The `providers` subcommands.
#[derive(Debug, Subcommand)]
pub enum ProvidersCommand {
    /// Every provider: its budget, its queues, what is left of the budget
    /// now, jobs in flight, pause and throttle.
    List,
    /// Create a provider or replace its budget and its queues (the change
    /// applies to every claim that starts after it, on every coordinator).
    Set(SetProviderArgs),
    /// Delete a provider: its queues are no longer limited.
    Delete {
        /// The provider.
        name: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Stop hand-outs for a provider (an incident at the provider): all of
    /// them, or with --sends-only only sends, while reconciles go on.
    Pause {
        /// The provider.
        name: String,
        /// Hold sends (first sends and resends) only; reconciles, takeovers
        /// included, go on within the budget.
        #[arg(long, default_value_t = false)]
        sends_only: bool,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// End a pause, and any throttle a worker reported (a 429).
    Resume {
        /// The provider.
        name: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// The recorded changes of providers and queue policies, newest first.
    History(HistoryArgs),
}

/// Arguments of `providers set`.
#[derive(Debug, Args)]
pub struct SetProviderArgs {
    /// The provider (1..=128 bytes of [A-Za-z0-9._-]).
    pub name: String,
    /// Units per second on average (fractions allowed: 0.5 is one every
    /// 2 s). Leave headroom for calls made outside jobfence.
    #[arg(long)]
    pub rate: f64,
    /// Units that may be spent at once after an idle period (at least the
    /// largest cost).
    #[arg(long)]
    pub burst: u32,
    /// Most jobs of its queues running with a live lease at once (no cap
    /// when left out).
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// Units a send (next_action execute) costs (1 when left out).
    #[arg(long)]
    pub execute_cost: Option<u32>,
    /// Units a reconcile costs (1 when left out; 2 when a reconcile takes
    /// two lookups at the provider).
    #[arg(long)]
    pub reconcile_cost: Option<u32>,
    /// A queue that dispatches to it (repeat for each). Replaces the
    /// provider's list: name every queue it keeps.
    #[arg(long = "queue", required = true)]
    pub queues: Vec<String>,
    #[command(flatten)]
    pub change: ChangeArgs,
}

/// Arguments of `providers history` and `queue-policies history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only the changes of this provider (or queue); all when left out.
    pub name: Option<String>,
    /// At most this many changes (1..=500).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Changes older than this change id (the next page).
    #[arg(long)]
    pub before: Option<u64>,
}

/// `jobfence queue-policies …`
#[derive(Debug, Args)]
pub struct QueuePoliciesArgs {
    /// Endpoint and output format.
    #[command(flatten)]
    pub conn: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: QueuePoliciesCommand,
}

/// The `queue-policies` subcommands.
#[derive(Debug, Subcommand)]
pub enum QueuePoliciesCommand {
    /// Every queue with a stored policy or a provider. A queue without a
    /// stored policy follows each coordinator's --resend-window and
    /// --max-dispatches flags.
    List,
    /// Store a queue's resend policy; it wins over every coordinator's
    /// --resend-window / --max-dispatches flags.
    Set {
        /// The queue.
        queue: String,
        /// The provider's idempotency window, counted from a job's first
        /// dispatch (e.g. 24h for Stripe).
        #[arg(long, value_parser = humantime::parse_duration)]
        resend_window: Duration,
        /// The most times a job may be handed out to be sent (execute).
        #[arg(long)]
        max_dispatches: u32,
        /// How long the queue's finished jobs are kept before they are
        /// pruned (e.g. 90d); unset: the coordinators' --retention-jobs.
        /// Their key records are kept at least as long.
        #[arg(long, value_parser = humantime::parse_duration)]
        retention: Option<Duration>,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Remove a queue's stored resend policy: the flags apply again.
    Delete {
        /// The queue.
        queue: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// The recorded changes of one queue's policy (or of every provider
    /// and queue), newest first.
    History(HistoryArgs),
}

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

/// A token file: its first line, trimmed.
pub fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    anyhow::ensure!(
        !token.is_empty(),
        "the token file {} is empty",
        path.display()
    );
    Ok(token)
}

/// A channel to the coordinator, authenticated as the flags say.
type Authed = InterceptedService<Channel, Authorization>;

fn read(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The TLS settings and token of `conn`.
fn credentials(conn: &Connection) -> anyhow::Result<Credentials> {
    let mut c = Credentials::default();
    if let Some(ca) = &conn.tls_ca {
        c.tls_ca_pem = Some(read(ca)?);
    }
    if let (Some(cert), Some(key)) = (&conn.tls_client_cert, &conn.tls_client_key) {
        c.tls_client_pem = Some((read(cert)?, read(key)?));
    }
    if let Some(file) = &conn.token_file {
        let token = read_token(file)?;
        c.token = Some(BearerToken::new(&token)?);
    }
    Ok(c)
}

async fn channel(conn: &Connection) -> anyhow::Result<Authed> {
    let creds = credentials(conn)?;
    if creds.token.is_some() && creds.tls_ca_pem.is_none() {
        eprintln!(
            "jobfence: warning: sending the bearer token without TLS to {} \
             (give --tls-ca or JOBFENCE_TLS_CA for a coordinator with TLS)",
            conn.endpoint
        );
    }
    let channel = creds
        .endpoint(with_scheme(&conn.endpoint))
        .with_context(|| format!("bad endpoint {}", conn.endpoint))?
        .connect()
        .await
        .with_context(|| format!("connecting to {}", conn.endpoint))?;
    Ok(InterceptedService::new(channel, creds.authorization()))
}

/// A refusal as one line: code, ErrorInfo reason, message, metadata; then
/// each bad field of a BadRequest on a line of its own.
pub fn describe_status(status: &tonic::Status) -> String {
    describe_status_with_flags(status, &[])
}

/// Request fields and the flags that set them: `(field, flag)`, where a
/// field ending in `[` stands for every element of a list (`queues[0]`).
type FlagNames = [(&'static str, &'static str)];

/// The flags of `providers set`, `delete`, `pause` and `resume`.
const PROVIDER_FLAGS: &FlagNames = &[
    ("name", "NAME"),
    ("budget.rate_per_second", "--rate"),
    ("budget.burst", "--burst"),
    ("budget.max_in_flight", "--max-in-flight"),
    ("budget.execute_cost", "--execute-cost"),
    ("budget.reconcile_cost", "--reconcile-cost"),
    ("queues[", "--queue"),
    ("queues", "--queue"),
    ("operator", "--operator"),
    ("reason", "--reason"),
];

/// The flags of `queue-policies set` and `delete`.
const QUEUE_POLICY_FLAGS: &FlagNames = &[
    ("queue", "QUEUE"),
    ("resend_window", "--resend-window"),
    ("max_dispatches", "--max-dispatches"),
    ("job_retention", "--retention"),
    ("operator", "--operator"),
    ("reason", "--reason"),
];

/// The flag that sets request field `field`, if any.
fn flag_of(field: &str, flags: &FlagNames) -> Option<&'static str> {
    flags.iter().find_map(|(f, flag)| {
        let hit = if f.ends_with('[') {
            field.starts_with(f)
        } else {
            field == *f
        };
        hit.then_some(*flag)
    })
}

/// [`describe_status`], naming the flag of each bad field (`budget.burst
/// (--burst): …`).
pub fn describe_status_with_flags(status: &tonic::Status, flags: &FlagNames) -> String {
    let violations = status
        .get_details_bad_request()
        .map(|b| b.field_violations)
        .unwrap_or_default();
    // The message repeats every violation on one line; they follow, one
    // per line, so say instead what an INVALID_ARGUMENT means.
    let message = if violations.is_empty() {
        status.message().to_owned()
    } else {
        "nothing was written; fix each field below".to_owned()
    };
    let mut s = format!("{:?}", status.code());
    if let Some(info) = status.get_details_error_info() {
        s.push(' ');
        s.push_str(&info.reason);
        let mut meta: Vec<_> = info.metadata.into_iter().collect();
        meta.sort();
        let meta: Vec<String> = meta.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push_str(&format!(": {message}"));
        if !meta.is_empty() {
            s.push_str(&format!(" ({})", meta.join(" ")));
        }
    } else {
        s.push_str(&format!(": {}", status.message()));
        if matches!(
            status.code(),
            tonic::Code::Unknown | tonic::Code::Unavailable
        ) {
            // Not a coordinator's answer: most often TLS on one side only.
            s.push_str(
                " (no answer from a jobfence coordinator: check --endpoint; a coordinator \
                 with TLS needs --tls-ca or JOBFENCE_TLS_CA, one run with --insecure an http:// endpoint)",
            );
        }
    }
    for v in violations {
        match flag_of(&v.field, flags) {
            Some(flag) => s.push_str(&format!("\n  {} ({flag}): {}", v.field, v.description)),
            None => s.push_str(&format!("\n  {}: {}", v.field, v.description)),
        }
    }
    s
}

fn refused(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(describe_status(&status))
}

fn refused_provider(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(describe_status_with_flags(&status, PROVIDER_FLAGS))
}

fn refused_queue_policy(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(describe_status_with_flags(&status, QUEUE_POLICY_FLAGS))
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// Runs one operator command, printing to `out`.
pub async fn run(op: Operation, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    match op {
        Operation::Jobs(args) => jobs(args, out).await,
        Operation::Stats(args) => {
            let mut client = JobAdminClient::new(channel(&args.conn).await?);
            let stats = client
                .queue_stats(proto::QueueStatsRequest {
                    queue: args.queue.unwrap_or_default(),
                    window: Some(duration(args.window)),
                })
                .await
                .map_err(refused)?
                .into_inner();
            render::stats(out, &stats, args.conn.json)
        }
        Operation::Events(args) => events(args, out).await,
        Operation::Providers(args) => providers(args, out).await,
        Operation::QueuePolicies(args) => queue_policies(args, out).await,
    }
}

async fn jobs(args: JobsArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let json = args.conn.json;
    let mut client = JobAdminClient::new(channel(&args.conn).await?);
    match args.command {
        JobsCommand::List(l) => {
            let page = client
                .list_jobs(proto::ListJobsRequest {
                    queue: l.queue.unwrap_or_default(),
                    states: l.states.iter().map(|s| s.to_proto() as i32).collect(),
                    min_age: l.older_than.map(duration),
                    page_size: l.limit,
                    page_token: l.page_token.unwrap_or_default(),
                })
                .await
                .map_err(refused)?
                .into_inner();
            render::job_list(out, &page, json)
        }
        JobsCommand::Show { job_id } => {
            let detail = client
                .get_job(proto::GetJobDetailRequest { job_id })
                .await
                .map_err(refused)?
                .into_inner();
            render::job_detail(out, &detail, json)
        }
        JobsCommand::Resolve(r) => {
            let resolution = match r.to {
                ResolveTo::Succeeded => Resolution::Succeeded,
                ResolveTo::Failed => Resolution::Failed,
                ResolveTo::RetryReconcile => Resolution::RetryReconcile,
                ResolveTo::RetryExecute => Resolution::RetryExecute,
            };
            let done = client
                .resolve_manual_review(proto::ResolveManualReviewRequest {
                    job_id: r.job_id,
                    attempt: r.attempt,
                    resolution: resolution as i32,
                    operator: r.operator,
                    reason: r.reason,
                    provider_reference: r.provider_reference.unwrap_or_default(),
                    result: r.result.unwrap_or_default(),
                    delay: r.delay.map(duration),
                    authorize_resend: r.authorize_resend,
                })
                .await
                .map_err(refused)?
                .into_inner();
            render::written(out, "resolved", done.job.as_ref(), done.replayed, json)
        }
        JobsCommand::Cancel(c) => {
            let done = client
                .cancel_job(proto::CancelJobRequest {
                    job_id: c.job_id,
                    attempt: c.attempt,
                    operator: c.operator,
                    reason: c.reason,
                })
                .await
                .map_err(refused)?
                .into_inner();
            render::written(out, "cancelled", done.job.as_ref(), done.replayed, json)
        }
    }
}

async fn events(args: EventsArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let json = args.conn.json;
    let mut client = JobEventsClient::new(channel(&args.conn).await?);
    match args.command {
        EventsCommand::List {
            after,
            limit,
            queue,
        } => {
            let page = client
                .list_events(proto::ListEventsRequest {
                    after_event_id: after,
                    limit,
                    queue: queue.unwrap_or_default(),
                })
                .await
                .map_err(refused)?
                .into_inner();
            render::event_page(out, &page, json)
        }
        EventsCommand::Watch { after, queue } => {
            let mut stream = client
                .watch_events(proto::WatchEventsRequest {
                    after_event_id: after,
                    queue: queue.unwrap_or_default(),
                })
                .await
                .map_err(refused)?
                .into_inner();
            while let Some(msg) = stream.message().await.map_err(refused)? {
                if let Some(e) = msg.event {
                    render::event_line(out, &e, json)?;
                    out.flush()?;
                }
            }
            Ok(())
        }
    }
}

async fn history(
    client: &mut JobAdminClient<Authed>,
    subject: String,
    h: HistoryArgs,
    out: &mut (dyn Write + Send),
    json: bool,
) -> anyhow::Result<()> {
    let changes = client
        .list_policy_changes(proto::ListPolicyChangesRequest {
            subject,
            limit: h.limit,
            before_change_id: h.before.unwrap_or(0),
        })
        .await
        .map_err(refused)?
        .into_inner();
    render::policy_changes(out, &changes, h.limit, json)
}

async fn providers(args: ProvidersArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let json = args.conn.json;
    let mut client = JobAdminClient::new(channel(&args.conn).await?);
    match args.command {
        ProvidersCommand::List => {
            let all = client
                .list_providers(proto::ListProvidersRequest {})
                .await
                .map_err(refused)?
                .into_inner();
            render::providers(out, &all.providers, json)
        }
        ProvidersCommand::Set(s) => {
            let done = client
                .put_provider(proto::PutProviderRequest {
                    name: s.name,
                    budget: Some(proto::ProviderBudget {
                        rate_per_second: s.rate,
                        burst: s.burst,
                        max_in_flight: s.max_in_flight,
                        execute_cost: s.execute_cost,
                        reconcile_cost: s.reconcile_cost,
                    }),
                    queues: s.queues,
                    operator: s.change.operator,
                    reason: s.change.reason,
                })
                .await
                .map_err(refused_provider)?
                .into_inner();
            let verb = if done.created { "created" } else { "updated" };
            render::provider_changed(out, verb, done.provider.as_ref(), json)
        }
        ProvidersCommand::Delete { name, change } => {
            let done = client
                .delete_provider(proto::DeleteProviderRequest {
                    name,
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_provider)?
                .into_inner();
            render::provider_changed(out, "deleted", done.provider.as_ref(), json)
        }
        ProvidersCommand::Pause {
            name,
            sends_only,
            change,
        } => {
            let pause = if sends_only {
                proto::ProviderPause::Sends
            } else {
                proto::ProviderPause::All
            };
            let done = client
                .pause_provider(proto::PauseProviderRequest {
                    name,
                    pause: pause as i32,
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_provider)?
                .into_inner();
            render::provider_changed(out, "paused", done.provider.as_ref(), json)
        }
        ProvidersCommand::Resume { name, change } => {
            let done = client
                .resume_provider(proto::ResumeProviderRequest {
                    name,
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_provider)?
                .into_inner();
            render::provider_changed(out, "resumed", done.provider.as_ref(), json)
        }
        ProvidersCommand::History(h) => {
            let subject = h
                .name
                .as_deref()
                .map(jobfence_domain::providers::provider_subject)
                .unwrap_or_default();
            history(&mut client, subject, h, out, json).await
        }
    }
}

async fn queue_policies(
    args: QueuePoliciesArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let json = args.conn.json;
    let mut client = JobAdminClient::new(channel(&args.conn).await?);
    match args.command {
        QueuePoliciesCommand::List => {
            let all = client
                .list_queue_policies(proto::ListQueuePoliciesRequest {})
                .await
                .map_err(refused)?
                .into_inner();
            render::queue_policies(out, &all.policies, json)
        }
        QueuePoliciesCommand::Set {
            queue,
            resend_window,
            max_dispatches,
            retention,
            change,
        } => {
            let done = client
                .put_queue_policy(proto::PutQueuePolicyRequest {
                    queue,
                    resend_window: Some(duration(resend_window)),
                    max_dispatches: Some(max_dispatches),
                    job_retention: retention.map(duration),
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_queue_policy)?
                .into_inner();
            render::queue_policy_changed(out, "stored", done.policy.as_ref(), json)
        }
        QueuePoliciesCommand::Delete { queue, change } => {
            let done = client
                .delete_queue_policy(proto::DeleteQueuePolicyRequest {
                    queue,
                    operator: change.operator,
                    reason: change.reason,
                })
                .await
                .map_err(refused_queue_policy)?
                .into_inner();
            render::queue_policy_changed(out, "deleted", done.policy.as_ref(), json)
        }
        QueuePoliciesCommand::History(h) => {
            let subject = h
                .name
                .as_deref()
                .map(jobfence_domain::providers::queue_subject)
                .unwrap_or_default();
            history(&mut client, subject, h, out, json).await
        }
    }
}

/// `host:port` is taken as `http://host:port`, as the server prints it.
fn with_scheme(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}
