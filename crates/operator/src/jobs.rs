//! `jobfence jobs list|show|resolve|cancel` (and `enqueue`, in enqueue.rs): jobs by queue, state and age;
//! one job with its observations and events; an operator's resolution of
//! a parked job and the cancel of one never dispatched, both fenced on the
//! attempt the operator saw.

use crate::connection::{channel, Connection};
use crate::duration;
use crate::events::{event_json, event_table};
use crate::refusal::{refused, refused_with_flags};
use crate::render::{action_name, enum_name, print_json, state_name, str_of, table, time};
use clap::{Args, Subcommand, ValueEnum};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{self as proto, Resolution};
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

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
    /// Enqueue one job (--queue, --key, --payload), or a file of them
    /// (--from, JSON lines); needs a producer's token.
    Enqueue(crate::enqueue::EnqueueArgs),
    /// Try a failed or cancelled job again as a new operation: a new job
    /// with a new operation key; the old one stays as it is.
    Retry(RetryArgs),
    /// Repair in bulk: cancel, fail or requeue the jobs a filter selects,
    /// each through its fenced write (a job that moved is skipped).
    Bulk(crate::bulk::BulkArgs),
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
    #[arg(long, value_parser = crate::args::duration_arg)]
    pub older_than: Option<Duration>,
    /// Jobs per page (1..=500).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Continue after a previous page (its next page token).
    #[arg(long)]
    pub page_token: Option<String>,
}

/// A job state on the command line (`manual-review`, or `manual_review`
/// as every table prints it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    Ready,
    Running,
    Succeeded,
    Failed,
    #[value(alias = "manual_review")]
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

/// The flags of a resolution's and a cancellation's fields, for refusals.
const RESOLVE_FLAGS: &crate::refusal::FlagNames = &[
    ("attempt", "--attempt"),
    ("resolution", "--to"),
    ("operator", "--operator"),
    ("reason", "--reason"),
    ("provider_reference", "--provider-reference"),
    ("result", "--result"),
    ("delay", "--delay"),
    ("authorize_resend", "--authorize-resend"),
];

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
    #[arg(long, value_parser = crate::args::duration_arg)]
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

/// Arguments of `jobs retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The failed or cancelled job.
    pub job_id: u64,
    /// The new job's operation key (the provider would answer the old one
    /// with the old refund); by default `{old key}:retry:{job id}`, the
    /// same every time, so asking twice makes one new job.
    #[arg(long)]
    pub new_key: Option<String>,
    /// Your name, as for `jobs resolve`.
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
    /// Why; recorded in both jobs' events.
    #[arg(long)]
    pub reason: String,
}

/// Runs `jobs …`, printing to `out`.
pub(crate) async fn run(args: JobsArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let json = args.conn.json;
    // Enqueue talks to JobCoordinator, as a producer; the rest to JobAdmin.
    let command = match args.command {
        JobsCommand::Enqueue(e) => return crate::enqueue::run(&args.conn, e, out).await,
        JobsCommand::Bulk(b) => return crate::bulk::run(&args.conn, b, out).await,
        other => other,
    };
    let mut client = JobAdminClient::new(channel(&args.conn).await?);
    match command {
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
            job_list(out, &page, json)
        }
        JobsCommand::Show { job_id } => {
            let detail = client
                .get_job(proto::GetJobDetailRequest { job_id })
                .await
                .map_err(refused)?
                .into_inner();
            job_detail(out, &detail, json)
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
                .map_err(|s| refused_with_flags(s, RESOLVE_FLAGS))?
                .into_inner();
            written(out, "resolved", done.job.as_ref(), done.replayed, json)
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
                .map_err(|s| refused_with_flags(s, RESOLVE_FLAGS))?
                .into_inner();
            written(out, "cancelled", done.job.as_ref(), done.replayed, json)
        }
        JobsCommand::Retry(r) => retry(&mut client, r, out, json).await,
        JobsCommand::Enqueue(_) | JobsCommand::Bulk(_) => unreachable!("answered above"),
    }
}

/// `jobs retry`.
async fn retry(
    client: &mut JobAdminClient<crate::connection::Authed>,
    r: RetryArgs,
    out: &mut (dyn Write + Send),
    json: bool,
) -> anyhow::Result<()> {
    let done = client
        .retry_as_new_operation(proto::RetryAsNewOperationRequest {
            job_id: r.job_id,
            new_operation_key: r.new_key.unwrap_or_default(),
            operator: r.operator,
            reason: r.reason,
        })
        .await
        .map_err(refused)?
        .into_inner();
    retried(out, &done, json)
}

fn retried(
    out: &mut dyn Write,
    done: &proto::RetryAsNewOperationResponse,
    json: bool,
) -> anyhow::Result<()> {
    let (Some(old), Some(new)) = (&done.old_job, &done.new_job) else {
        anyhow::bail!("the server answered without the jobs");
    };
    if json {
        return print_json(
            out,
            &json!({ "old_job": job_json(old), "new_job": job_json(new), "created": done.created }),
        );
    }
    writeln!(
        out,
        "job {} ({}) {} job {} with operation key {} ({}); job {} stays {}",
        old.job_id,
        old.operation_key,
        if done.created {
            "tried again as"
        } else {
            "was already tried again as"
        },
        new.job_id,
        new.operation_key,
        state_name(new.state),
        old.job_id,
        state_name(old.state),
    )?;
    Ok(())
}

fn job_json(j: &proto::Job) -> Value {
    json!({
        "job_id": j.job_id,
        "queue": j.queue,
        "operation_key": j.operation_key,
        "payload": j.payload,
        "state": state_name(j.state),
        "attempt": j.attempt,
        "next_action": action_name(j.next_action),
        "run_at": time(&j.run_at),
        "lease_until": time(&j.lease_until),
        "lease_owner": j.lease_owner,
        "first_dispatched_at": time(&j.first_dispatched_at),
        "dispatch_count": j.dispatch_count,
        "provider_reference": j.provider_reference,
        "result": j.result,
        "last_error": j.last_error,
        "state_reason": j.state_reason,
        "created_at": time(&j.created_at),
        "updated_at": time(&j.updated_at),
        "finished_at": time(&j.finished_at),
        "priority": j.priority,
        "fairness_key": j.fairness_key,
    })
}

/// A fairness key as the table prints it: `-` for none, so the columns
/// still split on blanks.
fn key_cell(key: &str) -> String {
    if key.is_empty() {
        "-".to_owned()
    } else {
        key.to_owned()
    }
}

fn observation_json(o: &proto::Observation) -> Value {
    let source = proto::ObservationSource::try_from(o.source)
        .map(|s| enum_name(s.as_str_name(), "OBSERVATION_SOURCE_"))
        .unwrap_or_default();
    let outcome = proto::ObservationOutcome::try_from(o.outcome)
        .map(|s| enum_name(s.as_str_name(), "OBSERVATION_OUTCOME_"))
        .unwrap_or_default();
    json!({
        "observation_id": o.observation_id,
        "attempt": o.attempt,
        "source": source,
        "outcome": outcome,
        "provider_reference": o.provider_reference,
        "body": o.body,
        "dedup_key": o.dedup_key,
        "recorded_at": time(&o.recorded_at),
    })
}

/// `jobs list`.
fn job_list(out: &mut dyn Write, page: &proto::ListJobsResponse, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({
                "jobs": page.jobs.iter().map(job_json).collect::<Vec<_>>(),
                "next_page_token": page.next_page_token,
            }),
        );
    }
    let rows: Vec<Vec<String>> = page
        .jobs
        .iter()
        .map(|j| {
            vec![
                j.job_id.to_string(),
                j.queue.clone(),
                state_name(j.state),
                j.attempt.to_string(),
                action_name(j.next_action),
                j.priority.to_string(),
                key_cell(&j.fairness_key),
                time(&j.created_at),
                time(&j.updated_at),
                j.operation_key.clone(),
                jobfence_domain::explain_state(
                    Some(j.state_reason.as_str()).filter(|r| !r.is_empty()),
                    Some(j.last_error.as_str()),
                )
                .unwrap_or_default(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "ID",
            "QUEUE",
            "STATE",
            "ATTEMPT",
            "NEXT",
            "PRIORITY",
            "FAIRNESS_KEY",
            "CREATED (UTC)",
            "UPDATED (UTC)",
            "OPERATION_KEY",
            "WHY",
        ],
        &rows,
    )?;
    if !page.next_page_token.is_empty() {
        writeln!(out, "more: --page-token {}", page.next_page_token)?;
    }
    Ok(())
}

/// `jobs show`.
fn job_detail(
    out: &mut dyn Write,
    d: &proto::GetJobDetailResponse,
    json: bool,
) -> anyhow::Result<()> {
    let job = d.job.as_ref().map(job_json).unwrap_or(Value::Null);
    if json {
        return print_json(
            out,
            &json!({
                "job": job,
                "observations": d.observations.iter().map(observation_json).collect::<Vec<_>>(),
                "events": d.events.iter().map(event_json).collect::<Vec<_>>(),
            }),
        );
    }
    if let Value::Object(fields) = &job {
        for (k, _) in fields {
            writeln!(out, "{k:<20} {}", str_of(&job, k))?;
        }
    }
    writeln!(out, "\nobservations:")?;
    let rows: Vec<Vec<String>> = d
        .observations
        .iter()
        .map(observation_json)
        .map(|o| {
            [
                "observation_id",
                "attempt",
                "source",
                "outcome",
                "provider_reference",
                "recorded_at",
            ]
            .iter()
            .map(|k| str_of(&o, k))
            .collect()
        })
        .collect();
    table(
        out,
        &[
            "ID",
            "ATTEMPT",
            "SOURCE",
            "OUTCOME",
            "PROVIDER_REF",
            "RECORDED (UTC)",
        ],
        &rows,
    )?;
    writeln!(out, "\nevents:")?;
    event_table(out, &d.events)
}

/// `jobs resolve` and `jobs cancel`.
fn written(
    out: &mut dyn Write,
    verb: &str,
    job: Option<&proto::Job>,
    replayed: bool,
    json: bool,
) -> anyhow::Result<()> {
    let Some(job) = job else {
        anyhow::bail!("the server answered without the job");
    };
    if json {
        return print_json(out, &json!({ "job": job_json(job), "replayed": replayed }));
    }
    let again = if replayed {
        " (already applied by this same request)"
    } else {
        ""
    };
    writeln!(
        out,
        "job {} {verb}: now {} (attempt {}){again}",
        job.job_id,
        state_name(job.state),
        job.attempt
    )?;
    Ok(())
}
