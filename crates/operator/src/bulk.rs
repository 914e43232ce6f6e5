//! `jobfence jobs bulk cancel|fail|requeue`: repair in bulk. The jobs
//! the listing counted go to the coordinator in batches (BulkRepair,
//! `--batch-size` jobs a call, oldest first), each batch one transaction
//! in which every job is checked as its single action would be
//! (CancelJob, ResolveManualReview), on the attempt the listing saw. A job
//! that moved meanwhile (claimed, completed, resolved by someone else) is
//! refused by its fence, skipped and counted, never overwritten; every
//! applied one is recorded in its events with the operator's name and
//! reason.
//!
//! Selecting: a queue (or `--all` for every queue), the age, the state
//! reason (manual review's `RESEND_WINDOW_CLOSED`, `MAX_DISPATCHES_REACHED`
//! or `REQUESTED`) and an operation-key prefix; the action fixes the state
//! (`cancel`: ready jobs never dispatched; `fail` and `requeue`: jobs in
//! manual review). `--dry-run` counts and shows the first few; more than
//! `--max` matching jobs need `--yes`.

use crate::connection::{channel, Authed, Connection};
use crate::duration;
use crate::pace::Pace;
use crate::refusal::refused;
use crate::render::print_json;
use anyhow::Context;
use clap::{Args, ValueEnum};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{self as proto, JobState};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

/// The manual-review reasons `--reason-code` takes.
const REASON_CODES: [&str; 3] = [
    "RESEND_WINDOW_CLOSED",
    "MAX_DISPATCHES_REACHED",
    jobfence_domain::MANUAL_REVIEW_REQUESTED,
];

/// `--max-rate` unless said otherwise, jobs a second: the pace at which
/// a bulk leaves the workers of its database most of their rate
/// (docs/benchmarks.md, "Repair in bulk").
pub const DEFAULT_MAX_RATE: u32 = 2500;

/// What `jobs bulk` does to each selected job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BulkAction {
    /// Cancel ready jobs never dispatched (CancelJob).
    Cancel,
    /// Resolve jobs in manual review to failed: the refund will not happen.
    Fail,
    /// Resolve jobs in manual review to retry-reconcile: back to ready, a
    /// worker asks the provider what happened first.
    Requeue,
}

/// Arguments of `jobs bulk`.
#[derive(Debug, Args)]
pub struct BulkArgs {
    /// What to do to each selected job.
    #[arg(value_enum)]
    pub action: BulkAction,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Every queue (needed when no --queue is given).
    #[arg(long, conflicts_with = "queue")]
    pub all: bool,
    /// Only jobs created at least this long ago (e.g. 2h).
    #[arg(long, value_parser = crate::args::duration_arg)]
    pub older_than: Option<Duration>,
    /// Only jobs parked for this reason (RESEND_WINDOW_CLOSED,
    /// MAX_DISPATCHES_REACHED, REQUESTED).
    #[arg(long)]
    pub reason_code: Option<String>,
    /// Only jobs whose operation key starts with this.
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Count the selected jobs and show the first ones; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// More jobs than this need --yes.
    #[arg(long, default_value_t = 1000)]
    pub max: usize,
    /// Act on more than --max jobs.
    #[arg(long)]
    pub yes: bool,
    /// Your name, as for `jobs resolve`.
    #[arg(long, env = "JOBFENCE_OPERATOR", default_value = "")]
    pub operator: String,
    /// Why; recorded in every job's events.
    #[arg(long)]
    pub reason: String,
    /// Jobs per call to the coordinator (1 to 1000), each call one
    /// transaction holding the row locks of its jobs until it commits.
    #[arg(long, default_value_t = jobfence_domain::admin::BULK_BATCH as u16,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub batch_size: u16,
    /// At most this many jobs a second, the count apart (0: as fast as
    /// the coordinator takes them). Flat out, a bulk takes the database
    /// time the workers' claims would have had; at the default pace it
    /// leaves them most of it (docs/operating.md, "Repair in bulk").
    #[arg(long, default_value_t = DEFAULT_MAX_RATE)]
    pub max_rate: u32,
}

/// One selected job: its id and the attempt the listing saw (the fence).
pub type Selected = (u64, u64);

/// What a bulk action did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BulkTally {
    pub selected: u64,
    pub applied: u64,
    /// Refused by the fence (the job moved meanwhile), by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Other refusals (the coordinator unreachable, …), by reason.
    pub errors: BTreeMap<String, u64>,
    /// The first of them, as printed.
    pub first_error: Option<String>,
    /// Batches the coordinator ran again after a conflict (a deadlock, a
    /// lock wait timeout); nothing of a rolled-back try was applied.
    pub conflicts_retried: u64,
    /// The coordinator refused the request itself (not one job, nor for a
    /// moment): no batch was sent after it.
    pub stopped: bool,
}

/// Whether a batch failed as a whole may go through sent again (the
/// coordinator or its database away for a moment, a conflict, a lost
/// answer); otherwise the request itself was refused and every batch
/// would be.
fn transient(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unavailable
            | DeadlineExceeded
            | Aborted
            | ResourceExhausted
            | Unknown
            | Internal
            | Cancelled
    )
}

/// A bulk action against one coordinator.
pub struct Bulk {
    client: JobAdminClient<Authed>,
    args: BulkArgs,
}

impl Bulk {
    /// Connects as `conn` says, after checking the filters: no queue needs
    /// `--all`, a reason code must be one of [`REASON_CODES`] (and only
    /// for the actions on manual review), `--reason` must be given.
    pub async fn connect(conn: &Connection, args: BulkArgs) -> anyhow::Result<Bulk> {
        anyhow::ensure!(
            args.queue.is_some() || args.all,
            "no --queue: naming every job of every queue takes an explicit --all"
        );
        if let Some(code) = &args.reason_code {
            anyhow::ensure!(
                REASON_CODES.contains(&code.as_str()),
                "--reason-code {code:?} is not a reason of manual review (one of {})",
                REASON_CODES.join(", ")
            );
            anyhow::ensure!(
                args.action != BulkAction::Cancel,
                "--reason-code selects jobs in manual review: cancel acts on ready jobs"
            );
        }
        anyhow::ensure!(
            !args.reason.trim().is_empty(),
            "--reason must say why (it is recorded)"
        );
        let client = JobAdminClient::new(channel(conn).await?);
        Ok(Bulk { client, args })
    }

    /// The jobs the filters select now, oldest first. Refuses a queue with
    /// no job at all (a typo acts on nothing: say so).
    pub async fn select(&mut self) -> anyhow::Result<Vec<Selected>> {
        if let Some(q) = &self.args.queue {
            let known = self
                .client
                .queue_stats(proto::QueueStatsRequest {
                    queue: q.clone(),
                    window: None,
                })
                .await
                .map_err(refused)?
                .into_inner();
            anyhow::ensure!(
                !known.queues.is_empty(),
                "--queue {q:?}: no job is in this queue (a misspelt name? `jobfence stats` \
                 lists the queues that have jobs)"
            );
        }
        let state = match self.args.action {
            BulkAction::Cancel => JobState::Ready,
            BulkAction::Fail | BulkAction::Requeue => JobState::ManualReview,
        };
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let page = self
                .client
                .list_jobs(proto::ListJobsRequest {
                    queue: self.args.queue.clone().unwrap_or_default(),
                    states: vec![state as i32],
                    min_age: self.args.older_than.map(duration),
                    page_size: 500,
                    page_token: token,
                })
                .await
                .map_err(refused)?
                .into_inner();
            out.extend(
                page.jobs
                    .iter()
                    .filter(|j| self.matches(j))
                    .map(|j| (j.job_id, j.attempt)),
            );
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    fn matches(&self, j: &proto::Job) -> bool {
        let a = &self.args;
        let code = a.reason_code.as_deref().is_none_or(|c| j.state_reason == c);
        let key = a
            .key_prefix
            .as_deref()
            .is_none_or(|p| j.operation_key.starts_with(p));
        let never_sent = a.action != BulkAction::Cancel || j.dispatch_count == 0;
        code && key && never_sent
    }

    /// Applies the action to each of `jobs`, fenced on its attempt, in
    /// batches of `--batch-size` in the order given, with a progress line
    /// on standard error.
    pub async fn apply(&mut self, jobs: &[Selected]) -> BulkTally {
        let mut tally = BulkTally {
            selected: jobs.len() as u64,
            ..Default::default()
        };
        let started = std::time::Instant::now();
        let mut last = started;
        let mut progress_shown = false;
        let mut done = 0;
        for batch in jobs.chunks(usize::from(self.args.batch_size.max(1))) {
            done += batch.len();
            match self.batch(batch).await {
                Ok(answer) => tally.count(answer),
                Err(s) => {
                    tally.failed(&s, batch.len() as u64);
                    // The request itself is refused (the operator's name,
                    // the reason, the credential's role): every batch
                    // would be, so stop here.
                    if !transient(s.code()) {
                        tally.stopped = true;
                        break;
                    }
                }
            }
            if let Some(ahead) = Pace(self.args.max_rate).ahead(done as u64, started) {
                tokio::time::sleep(ahead).await;
            }
            if last.elapsed().as_secs() >= 1 {
                eprint!(
                    "\rjobs: {done}/{} done, {} applied",
                    jobs.len(),
                    tally.applied
                );
                progress_shown = true;
                last = std::time::Instant::now();
            }
        }
        // The progress line ends here, if there was one.
        if progress_shown {
            eprintln!();
        }
        tally
    }

    /// One BulkRepair of `jobs`.
    async fn batch(
        &mut self,
        jobs: &[Selected],
    ) -> Result<proto::BulkRepairResponse, tonic::Status> {
        let action = match self.args.action {
            BulkAction::Cancel => proto::BulkAction::Cancel,
            BulkAction::Fail => proto::BulkAction::Fail,
            BulkAction::Requeue => proto::BulkAction::Requeue,
        };
        let req = proto::BulkRepairRequest {
            action: action as i32,
            jobs: jobs
                .iter()
                .map(|&(job_id, attempt)| proto::CountedJob { job_id, attempt })
                .collect(),
            operator: self.args.operator.clone(),
            reason: self.args.reason.clone(),
        };
        self.client.bulk_repair(req).await.map(|r| r.into_inner())
    }
}

/// The reasons of a job that moved since the listing: its fence refused
/// it (skipped, never overwritten).
const MOVED: [&str; 3] = [
    "JOB_NOT_CANCELLABLE",
    "ATTEMPT_SUPERSEDED",
    "JOB_NOT_IN_MANUAL_REVIEW",
];

impl BulkTally {
    /// Counts a batch's answer, job by job.
    fn count(&mut self, answer: proto::BulkRepairResponse) {
        use proto::bulk_repair_result::Result as R;
        self.conflicts_retried += u64::from(answer.conflicts_retried);
        for r in answer.results {
            match r.result {
                Some(R::Applied(_)) => self.applied += 1,
                Some(R::Error(e)) if MOVED.contains(&e.reason.as_str()) => {
                    *self.skipped.entry(e.reason).or_default() += 1;
                }
                Some(R::Error(e)) => {
                    if self.first_error.is_none() {
                        let mut said = format!("{} (job {}): {}", e.reason, r.job_id, e.message);
                        let mut meta: Vec<_> = e.metadata.into_iter().collect();
                        meta.sort();
                        for (k, v) in meta {
                            said.push_str(&format!(" {k}={v}"));
                        }
                        self.first_error = Some(said);
                    }
                    *self.errors.entry(e.reason).or_default() += 1;
                }
                None => *self.errors.entry("NO_ANSWER".into()).or_default() += 1,
            }
        }
    }

    /// The selected jobs no batch carried, after the request itself was
    /// refused.
    pub fn not_sent(&self) -> u64 {
        let counted =
            self.applied + self.skipped.values().sum::<u64>() + self.errors.values().sum::<u64>();
        self.selected.saturating_sub(counted)
    }

    /// Counts a batch refused or failed as a whole: none of its `jobs` done.
    fn failed(&mut self, s: &tonic::Status, jobs: u64) {
        *self.errors.entry(crate::refusal::reason_of(s)).or_default() += jobs;
        if self.first_error.is_none() {
            self.first_error = Some(crate::describe_status(s));
        }
    }
}

/// Runs `jobs bulk`, printing to `out`.
pub(crate) async fn run(
    conn: &Connection,
    args: BulkArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let (dry_run, max, yes) = (args.dry_run, args.max, args.yes);
    let mut bulk = Bulk::connect(conn, args).await?;
    let jobs = bulk.select().await.context("selecting the jobs")?;
    if dry_run {
        let first: Vec<String> = jobs.iter().take(10).map(|j| j.0.to_string()).collect();
        if conn.json {
            return print_json(
                out,
                &json!({ "selected": jobs.len(), "first_job_ids": first }),
            );
        }
        writeln!(
            out,
            "{} selected (dry run: nothing changed)",
            jobs_count(jobs.len())
        )?;
        if !first.is_empty() {
            writeln!(out, "  first: {}", first.join(", "))?;
        }
        return Ok(());
    }
    anyhow::ensure!(
        jobs.len() <= max || yes,
        "{} selected, more than --max {max}: add --yes to act on all of them (--dry-run shows them)",
        jobs_count(jobs.len())
    );
    let tally = bulk.apply(&jobs).await;
    summary(out, conn.json, &tally)?;
    let errors: u64 = tally.errors.values().sum();
    let not_done = tally.selected - tally.applied - tally.skipped.values().sum::<u64>();
    let first = tally.first_error.as_deref().unwrap_or("?");
    anyhow::ensure!(
        !tally.stopped,
        "{not_done} job(s) not done: the coordinator refused the request itself with {first}; \
         nothing more was sent (fix that, then run it again)"
    );
    anyhow::ensure!(
        errors == 0,
        "{not_done} job(s) not done, the first refused with {first}; run it again for them"
    );
    Ok(())
}

fn summary(out: &mut (dyn Write + Send), json: bool, t: &BulkTally) -> anyhow::Result<()> {
    if json {
        return print_json(
            out,
            &json!({
                "selected": t.selected,
                "applied": t.applied,
                "skipped": t.skipped,
                "errors": t.errors,
                "conflicts_retried": t.conflicts_retried,
                "not_sent": t.not_sent(),
            }),
        );
    }
    let skipped: u64 = t.skipped.values().sum();
    writeln!(
        out,
        "{} selected: {} applied, {} skipped (moved meanwhile)",
        t.selected, t.applied, skipped
    )?;
    for (reason, n) in t.skipped.iter().chain(&t.errors) {
        writeln!(out, "  {reason}: {n}")?;
    }
    if t.not_sent() > 0 {
        writeln!(
            out,
            "  not sent (the request itself was refused): {}",
            t.not_sent()
        )?;
    }
    if t.conflicts_retried > 0 {
        writeln!(
            out,
            "  batches run again after a conflict: {}",
            t.conflicts_retried
        )?;
    }
    Ok(())
}

/// "1 job", "2 jobs".
fn jobs_count(n: usize) -> String {
    match n {
        1 => "1 job".to_owned(),
        n => format!("{n} jobs"),
    }
}
