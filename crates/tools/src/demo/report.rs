//! The demo's numbers, read from the coordinator's tables and the provider's
//! ledger, and the invariant: refunds actually made per operation_key are
//! exactly 1 for every succeeded job and at most 1 for every other.

use anyhow::Result;
use jobfence_domain::durability;
use jobfence_fake_provider::{Ledger, ProviderStats};
use jobfence_store::JobStore;
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Runs one of the demo's own reads again while it fails, for up to 15 s:
/// on Galera a node rejoining after the demo killed it can hold a causal
/// read (`wsrep_sync_wait`) past its timeout (1205), which says nothing
/// about the jobs. The reads change nothing, so running them again is safe.
pub async fn observe<T, F, Fut>(what: &str, mut read: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        match read().await {
            Ok(v) => return Ok(v),
            Err(e) if tries < 30 => {
                tries += 1;
                tracing::debug!(error = %e, what, "the demo's read failed; reading again");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.context(format!("reading {what}"))),
        }
    }
}

/// Counts by job state, over every database.
pub async fn states_all(pools: &[MySqlPool]) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for pool in pools {
        for (k, v) in observe("the jobs by state", || states(pool)).await? {
            *out.entry(k).or_default() += v;
        }
    }
    Ok(out)
}

/// Counts by job state.
pub async fn states(pool: &MySqlPool) -> Result<BTreeMap<String, i64>> {
    let rows =
        sqlx::query("SELECT CAST(state AS CHAR) AS s, COUNT(*) AS n FROM jobs GROUP BY state")
            .fetch_all(pool)
            .await?;
    let mut out = BTreeMap::new();
    for r in rows {
        out.insert(text(&r, "s")?, r.try_get::<i64, _>("n")?);
    }
    Ok(out)
}

fn text(r: &sqlx::mysql::MySqlRow, col: &str) -> Result<String> {
    let b: Option<Vec<u8>> = r.try_get(col)?;
    Ok(b.map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default())
}

async fn count_events(pool: &MySqlPool, kind: &str) -> Result<i64> {
    Ok(
        sqlx::query("SELECT COUNT(*) AS n FROM job_events WHERE kind = ?")
            .bind(kind)
            .fetch_one(pool)
            .await?
            .try_get("n")?,
    )
}

/// Whether the database keeps a committed attempt through a crash
/// (docs/design.md rule 9), for the log and the report: `yes (settings)`,
/// `NO (setting=value: risk; …)` or `unknown (error)`.
pub async fn database_durable(pool: &MySqlPool) -> String {
    match JobStore::new(pool.clone()).durability_settings().await {
        Ok(settings) => {
            let d = durability::assess(settings);
            if d.is_durable() {
                format!("yes ({})", d.summary())
            } else {
                let risks: Vec<String> = d.risks.iter().map(|r| r.to_string()).collect();
                format!("NO ({})", risks.join("; "))
            }
        }
        Err(e) => format!("unknown ({e})"),
    }
}

/// The takeover storm: every coordinator stopped for longer than the
/// lease, so every lease the workers held had expired when they came back.
#[derive(Debug, Clone, PartialEq)]
pub struct Storm {
    /// Jobs running with an expired lease just before the coordinators
    /// started again.
    pub expired: usize,
    /// Of those, taken over (the others their holder finished itself, a
    /// write already on its way).
    pub taken_over: usize,
    /// From the first takeover of those jobs to the last (database clock):
    /// how the budget spread the storm's reconciles.
    pub handed_out: Option<std::time::Duration>,
    /// From the first takeover of those jobs to the last write-back of a
    /// takeover's reconcile (database clock); `None` if they had not all
    /// been written back when the demo stopped waiting, or none was taken
    /// over.
    pub drained: Option<std::time::Duration>,
}

/// The provider's side: its limit, what it saw, and the budget under it.
#[derive(Debug, Clone)]
pub struct ProviderSide {
    /// The limit (`… requests/s (burst …)`).
    pub limit: String,
    /// The budget (`… units/s …` or `off (--no-budget)`).
    pub budget: String,
    /// What the provider counted (`GET /_admin/stats`).
    pub stats: ProviderStats,
}

/// Everything the final report prints.
#[derive(Debug, Default)]
pub struct Report {
    /// See [`database_durable`]; not printed when empty.
    pub database_durable: String,
    pub jobs: i64,
    pub states: BTreeMap<String, i64>,
    /// Manual reviews by reason (the coordinator's, or the worker's error).
    pub manual_reviews: BTreeMap<String, i64>,
    pub takeovers: i64,
    /// Stale writes rejected, by RPC: the `stale_write_rejected` events of
    /// the tables and of the prune archive (the pruner removes a finished
    /// job's events with it, so the tables alone lose the early ones).
    pub stale_rejected: BTreeMap<String, i64>,
    /// The same events one by one, by (job id, event id) → RPC: a job in
    /// the tables and in the archive (archived again after a failed
    /// commit) counts once.
    stale_events: BTreeMap<(u64, u64), String>,
    pub observations: i64,
    pub resends_allowed: i64,
    pub refunds_made: u64,
    /// Succeeded jobs by the worker that completed them, the pruned ones
    /// (read from the prune archive) included.
    pub completed_by: BTreeMap<String, i64>,
    /// The same one by one: job id → the worker that completed it.
    completed: BTreeMap<u64, String>,
    /// Jobs not in a terminal state or manual_review, or in manual_review
    /// without a reason.
    pub unfinished: Vec<String>,
    /// The process failures the demo injected, in order.
    pub injected: Vec<String>,
    /// Invariant violations, one line each.
    pub violations: Vec<String>,
    /// The provider's limit, requests, 429s and the budget; not printed
    /// when unknown.
    pub provider: Option<ProviderSide>,
    /// The takeover storm, when it happened.
    pub storm: Option<Storm>,
    /// Jobs pruned during the run (their key records), counted in
    /// `states` by their final state.
    pub pruned: i64,
    /// The ids of the pruned jobs (their key records).
    pub pruned_ids: Vec<u64>,
    /// Jobs in the pruner's archive (distinct), and its files; `None`
    /// when not checked.
    pub archived: Option<(usize, usize)>,
    /// The producer's Enqueues of pruned keys: sent, and answered with the
    /// pruned job and created=false.
    pub pruned_retries: (u32, u32),
    /// The product's own settlement of the provider's report.
    pub settlement: Option<super::settle::Settled>,
    /// What the workers called the coordinators for their jobs.
    pub calls: super::calls::WorkerCalls,
    /// The workers the coordinators saw, with their clients.
    pub workers_seen: super::seen::WorkersSeen,
    /// The bulk refund and the waits for a first hand-out; not printed
    /// when unknown.
    pub fair: Option<super::fairness::FairHandOut>,
}

impl Report {
    /// Reads the tables of every database (one, or the demo's shards) and
    /// checks the ledger.
    pub async fn gather_all(pools: &[MySqlPool], ledger: &Ledger) -> Result<Report> {
        let mut all = Report::default();
        for pool in pools {
            let r = Report::gather(pool, ledger).await?;
            let add = |into: &mut BTreeMap<String, i64>, from: BTreeMap<String, i64>| {
                for (k, v) in from {
                    *into.entry(k).or_default() += v;
                }
            };
            all.jobs += r.jobs;
            add(&mut all.states, r.states);
            add(&mut all.manual_reviews, r.manual_reviews);
            all.stale_events.extend(r.stale_events);
            all.completed.extend(r.completed);
            all.takeovers += r.takeovers;
            all.observations += r.observations;
            all.resends_allowed += r.resends_allowed;
            all.refunds_made += r.refunds_made;
            all.pruned += r.pruned;
            all.pruned_ids.extend(r.pruned_ids);
            all.unfinished.extend(r.unfinished);
            all.violations.extend(r.violations);
        }
        all.tally();
        Ok(all)
    }

    /// Reads the tables of one database and checks the ledger.
    pub async fn gather(pool: &MySqlPool, ledger: &Ledger) -> Result<Report> {
        let mut r = Report {
            states: states(pool).await?,
            takeovers: count_events(pool, "taken_over").await?,
            observations: sqlx::query("SELECT COUNT(*) AS n FROM job_observations")
                .fetch_one(pool)
                .await?
                .try_get("n")?,
            ..Report::default()
        };
        r.check_pruned(pool, ledger).await?;
        r.jobs = r.states.values().sum();
        r.read_events(pool).await?;
        r.read_outcomes(pool).await?;
        r.check_jobs(pool, ledger).await?;
        r.tally();
        Ok(r)
    }

    /// Pruned jobs: their key records, checked against the ledger like
    /// the rows (docs/design.md rule 14: the key outlives the row), and
    /// counted by their final state.
    async fn check_pruned(&mut self, pool: &MySqlPool, ledger: &Ledger) -> Result<()> {
        for row in sqlx::query(
            "SELECT job_id, CAST(operation_key AS CHAR) AS k, CAST(final_state AS CHAR) AS s \
             FROM operation_keys",
        )
        .fetch_all(pool)
        .await?
        {
            let id: u64 = row.try_get("job_id")?;
            let key = text(&row, "k")?;
            let state = text(&row, "s")?;
            let made = ledger.by_merchant_reference(&key).refunds;
            self.refunds_made += made;
            self.pruned += 1;
            self.pruned_ids.push(id);
            *self.states.entry(state.clone()).or_default() += 1;
            if (state == "succeeded" && made != 1) || made > 1 {
                self.violations.push(format!(
                    "pruned job {id} ({key}) {state} with {made} refunds made"
                ));
            }
        }
        Ok(())
    }

    /// The stale writes rejected and the resends allowed, from the
    /// events still in the tables.
    async fn read_events(&mut self, pool: &MySqlPool) -> Result<()> {
        for row in sqlx::query(
            "SELECT job_id, id, CAST(SUBSTRING_INDEX(detail, ':', 1) AS CHAR) AS rpc \
             FROM job_events WHERE kind = 'stale_write_rejected'",
        )
        .fetch_all(pool)
        .await?
        {
            self.stale_events.insert(
                (row.try_get("job_id")?, row.try_get("id")?),
                text(&row, "rpc")?,
            );
        }
        self.resends_allowed = sqlx::query(
            "SELECT COUNT(*) AS n FROM job_events WHERE kind = 'retry_scheduled' AND detail = 'retry_execute'",
        )
        .fetch_one(pool)
        .await?
        .try_get("n")?;
        Ok(())
    }

    /// Manual reviews by reason, and who completed each succeeded job.
    async fn read_outcomes(&mut self, pool: &MySqlPool) -> Result<()> {
        for row in sqlx::query(
            "SELECT CAST(IF(state_reason = 'REQUESTED' OR state_reason IS NULL, \
             CONCAT('worker: ', LEFT(last_error, 40)), state_reason) AS CHAR) AS why, \
             COUNT(*) AS n FROM jobs WHERE state = 'manual_review' GROUP BY why",
        )
        .fetch_all(pool)
        .await?
        {
            self.manual_reviews
                .insert(text(&row, "why")?, row.try_get("n")?);
        }
        for row in sqlx::query(
            "SELECT id, CAST(lease_owner AS CHAR) AS w FROM jobs WHERE state = 'succeeded'",
        )
        .fetch_all(pool)
        .await?
        {
            self.completed.insert(row.try_get("id")?, text(&row, "w")?);
        }
        Ok(())
    }

    /// Every job in the tables against the ledger: a succeeded job with
    /// other than one refund, or any job with more than one, is a
    /// violation; a job still open, or parked without a reason, is
    /// unfinished.
    async fn check_jobs(&mut self, pool: &MySqlPool, ledger: &Ledger) -> Result<()> {
        for row in sqlx::query(
            "SELECT id, CAST(operation_key AS CHAR) AS k, CAST(state AS CHAR) AS s, \
             (state_reason IS NOT NULL OR last_error IS NOT NULL) AS has_reason FROM jobs",
        )
        .fetch_all(pool)
        .await?
        {
            let id: u64 = row.try_get("id")?;
            let key = text(&row, "k")?;
            let state = text(&row, "s")?;
            let made = ledger.by_merchant_reference(&key).refunds;
            self.refunds_made += made;
            match state.as_str() {
                "succeeded" if made != 1 => self.violations.push(format!(
                    "job {id} ({key}) succeeded with {made} refunds made"
                )),
                "succeeded" => {}
                _ if made > 1 => self.violations.push(format!(
                    "job {id} ({key}) is {state} with {made} refunds made"
                )),
                "ready" | "running" => self.unfinished.push(format!("job {id} ({key}) is {state}")),
                "manual_review" if row.try_get::<i64, _>("has_reason")? == 0 => {
                    self.unfinished.push(format!(
                        "job {id} ({key}) is in manual_review without a reason"
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Adds the producer's Enqueues of pruned keys; each not answered with
    /// its pruned job and created=false is a violation.
    pub fn add_pruned_retries(&mut self, p: &super::arrivals::PrunedRetries) {
        use std::sync::atomic::Ordering;
        self.pruned_retries = (
            p.sent.load(Ordering::Relaxed),
            p.answered.load(Ordering::Relaxed),
        );
        self.violations
            .extend(p.wrong.lock().expect("pruned retries").iter().cloned());
    }

    /// Checks the pruner's archive: every pruned job must be in it (a
    /// missing one is a violation).
    pub(super) fn check_archive(&mut self, archived: &super::archive::Archived) {
        self.stale_events.extend(archived.stale.clone());
        self.completed.extend(archived.completed.clone());
        self.tally();
        for id in &self.pruned_ids {
            if !archived.jobs.contains_key(id) {
                self.violations
                    .push(format!("pruned job {id} is not in the prune archive"));
            }
        }
        self.archived = Some((archived.jobs.len(), archived.files));
    }

    /// `stale_rejected` and `completed_by` counted again from
    /// `stale_events` and `completed`.
    fn tally(&mut self) {
        self.stale_rejected.clear();
        for rpc in self.stale_events.values() {
            *self.stale_rejected.entry(rpc.clone()).or_default() += 1;
        }
        self.completed_by.clear();
        for worker in self.completed.values() {
            *self.completed_by.entry(worker.clone()).or_default() += 1;
        }
    }

    /// Adds the settlement: every exception it left is a violation.
    pub(super) fn add_settlement(&mut self, settled: super::settle::Settled) {
        for (kind, subject) in &settled.exceptions {
            self.violations
                .push(format!("settlement exception {kind} of {subject}"));
        }
        self.settlement = Some(settled);
    }

    /// True when no refund was made twice and nothing is lost.
    pub fn ok(&self) -> bool {
        self.violations.is_empty() && self.unfinished.is_empty()
    }

    /// The printed report; its last line is `invariant: OK` or
    /// `invariant: VIOLATED (…)`.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "jobfence demo report");
        self.render_jobs(&mut s);
        self.render_pruning(&mut s);
        self.render_fencing(&mut s);
        self.render_provider(&mut s);
        if let Some(fair) = &self.fair {
            fair.render(&mut s);
        }
        if let Some(settled) = &self.settlement {
            settled.render(&mut s);
        }
        self.render_verdict(&mut s);
        s
    }

    /// The database, the jobs, the failures injected and how the jobs
    /// ended.
    fn render_jobs(&self, s: &mut String) {
        if !self.database_durable.is_empty() {
            let _ = writeln!(s, "  database durable        {}", self.database_durable);
        }
        let _ = writeln!(s, "  jobs                    {}", self.jobs);
        for (i, what) in self.injected.iter().enumerate() {
            let head = if i == 0 { "failures injected" } else { "" };
            let _ = writeln!(s, "  {head:<23} {what}");
        }
        let _ = writeln!(s, "  by final state          {}", joined(&self.states));
        let finished =
            self.states.values().sum::<i64>() - self.states.get("ready").copied().unwrap_or(0);
        self.calls.render(s, finished);
        self.workers_seen.render(s);
        let _ = writeln!(
            s,
            "  completed by            {}",
            joined(&self.completed_by)
        );
    }

    /// What the pruner removed during the run, and its archive.
    fn render_pruning(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "  pruned                  {} finished jobs (key records kept); {} Enqueues of pruned keys sent again, {} answered the pruned job with created=false",
            self.pruned, self.pruned_retries.0, self.pruned_retries.1
        );
        if let Some((jobs, files)) = self.archived {
            let missing = self
                .violations
                .iter()
                .filter(|v| v.ends_with("is not in the prune archive"))
                .count();
            let _ = writeln!(
                s,
                "  archived                {jobs} jobs in {files} archive files; {}",
                if missing == 0 {
                    "every pruned job is in the archive".to_string()
                } else {
                    format!("{missing} pruned jobs MISSING from it")
                }
            );
        }
    }

    /// What the fence did: takeovers (the storm's too), stale writes
    /// rejected, observations, resends, manual reviews, and the refunds
    /// the ledger holds.
    fn render_fencing(&self, s: &mut String) {
        let _ = writeln!(s, "  takeovers               {}", self.takeovers);
        if let Some(storm) = &self.storm {
            let _ = writeln!(
                s,
                "  takeover storm          {} leases expired at once, {} taken over; {}",
                storm.expired,
                storm.taken_over,
                match (storm.handed_out, storm.drained) {
                    (Some(h), Some(d)) => format!(
                        "their reconciles handed out within {:.1} s, all written back within {:.1} s",
                        h.as_secs_f64(),
                        d.as_secs_f64()
                    ),
                    _ if storm.taken_over == 0 => "no reconcile".to_owned(),
                    _ => "their reconciles had not drained when the demo stopped".to_owned(),
                }
            );
        }
        let _ = writeln!(
            s,
            "  stale writes rejected   {}",
            joined(&self.stale_rejected)
        );
        let _ = writeln!(s, "  observations recorded   {}", self.observations);
        let _ = writeln!(s, "  resends allowed         {}", self.resends_allowed);
        let _ = writeln!(
            s,
            "  manual reviews          {}",
            joined(&self.manual_reviews)
        );
        let _ = writeln!(s, "  refunds made (ledger)   {}", self.refunds_made);
    }

    /// The provider's limit, what it counted, and the budget under it.
    fn render_provider(&self, s: &mut String) {
        if let Some(p) = &self.provider {
            let _ = writeln!(
                s,
                "  provider limit          {}; peak {} requests/s",
                p.limit, p.stats.peak_requests_per_second
            );
            let _ = writeln!(
                s,
                "  provider 429s           {} of {} requests",
                p.stats.rate_limited, p.stats.requests
            );
            let _ = writeln!(s, "  provider budget         {}", p.budget);
        }
    }

    /// The first jobs not finished and violations, and the last line:
    /// `invariant: OK` or `invariant: VIOLATED (…)`.
    fn render_verdict(&self, s: &mut String) {
        for u in self.unfinished.iter().take(10) {
            let _ = writeln!(s, "  not finished: {u}");
        }
        for v in self.violations.iter().take(10) {
            let _ = writeln!(s, "  VIOLATION: {v}");
        }
        if self.ok() {
            let _ = write!(s, "invariant: OK");
        } else {
            let mut what = Vec::new();
            if !self.violations.is_empty() {
                what.push(format!("{} violations", self.violations.len()));
            }
            if !self.unfinished.is_empty() {
                what.push(format!("{} jobs not finished", self.unfinished.len()));
            }
            let _ = write!(s, "invariant: VIOLATED ({})", what.join("; "));
        }
    }
}

/// `k v, k v, …` of a count per name, or `none`.
fn joined(m: &BTreeMap<String, i64>) -> String {
    if m.is_empty() {
        "none".to_owned()
    } else {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
