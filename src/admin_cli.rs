//! Operator commands: `jobfence jobs list|show|resolve|cancel`,
//! `jobfence stats` and `jobfence events list|watch`. They talk gRPC to a
//! running coordinator (JobAdmin, JobEvents), print human-readable tables by
//! default and JSON with `--json`. A refusal is printed with its ErrorInfo
//! reason and metadata and makes the command exit non-zero.

mod render;

use crate::proto::job_admin_client::JobAdminClient;
use crate::proto::job_events_client::JobEventsClient;
use crate::proto::{self, Resolution};
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
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
    /// `jobs` and `stats`, an events-reader's for `events`).
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

/// One operator command.
#[derive(Debug)]
pub enum Operation {
    /// `jobfence jobs …`
    Jobs(JobsArgs),
    /// `jobfence stats`
    Stats(StatsArgs),
    /// `jobfence events …`
    Events(EventsArgs),
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
        let token = crate::security_cli::read_token(file)?;
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

/// A refusal as one line: code, ErrorInfo reason, message, metadata.
pub fn describe_status(status: &tonic::Status) -> String {
    let mut s = format!("{:?}", status.code());
    if let Some(info) = status.get_details_error_info() {
        s.push(' ');
        s.push_str(&info.reason);
        let mut meta: Vec<_> = info.metadata.into_iter().collect();
        meta.sort();
        let meta: Vec<String> = meta.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push_str(&format!(": {}", status.message()));
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
    if let Some(bad) = status.get_details_bad_request() {
        for v in bad.field_violations {
            s.push_str(&format!("\n  {}: {}", v.field, v.description));
        }
    }
    s
}

fn refused(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(describe_status(&status))
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

/// `host:port` is taken as `http://host:port`, as the server prints it.
fn with_scheme(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}
