//! The operator calls (JobAdmin) and the events feed (JobEvents): request
//! limits, then the store, then the log line and the metric.

use super::Coordinator;
use jobfence_domain::admin::{
    CancelJob, ListJobsFilter, QueueStats, Resolution, ResolveManualReview,
};
use jobfence_domain::feed::{FeedEvent, FeedPage};
use jobfence_domain::providers::{HoldKind, QueueHold};
use jobfence_domain::validate::{Violations, MAX_BODY_BYTES, MAX_DELAY, MAX_ERROR_BYTES};
use jobfence_domain::{CoordinatorError, Job, Observation, WriteOutcome};

use std::time::Duration;

/// Most jobs one ListJobs page returns.
pub const MAX_PAGE_SIZE: u32 = 500;
/// ListJobs page size when the request names none.
pub const DEFAULT_PAGE_SIZE: u32 = 50;
/// Most events one ListEvents page returns.
pub const MAX_EVENTS_PAGE: u32 = 1000;
/// ListEvents page size when the request names none.
pub const DEFAULT_EVENTS_PAGE: u32 = 100;
/// QueueStats window when the request names none (1 h).
pub const DEFAULT_STATS_WINDOW: Duration = Duration::from_secs(3600);

/// A job as an operator sees it: with its evidence and its history.
#[derive(Debug, Clone, PartialEq)]
pub struct JobDetail {
    /// The row as stored.
    pub job: Job,
    /// Evidence, oldest first.
    pub observations: Vec<Observation>,
    /// Every event of the job, oldest first.
    pub events: Vec<FeedEvent>,
}

pub(crate) fn operator_fields(v: &mut Violations, operator: &str, reason: &str) {
    v.key("operator", operator);
    v.required("reason", reason, "must say why (it is recorded)");
    v.max_bytes("reason", reason, MAX_ERROR_BYTES);
}

impl Coordinator {
    /// ListJobs: `filter.limit` 0 means [`DEFAULT_PAGE_SIZE`]. Returns the
    /// page and, when more jobs match, the id to continue after.
    pub async fn list_jobs(
        &self,
        mut filter: ListJobsFilter,
    ) -> Result<(Vec<Job>, Option<u64>), CoordinatorError> {
        let mut v = Violations::default();
        if let Some(q) = &filter.queue {
            v.queue("queue", q);
        }
        if filter.limit == 0 {
            filter.limit = DEFAULT_PAGE_SIZE;
        } else if filter.limit > MAX_PAGE_SIZE {
            v.add("page_size", format!("must be at most {MAX_PAGE_SIZE}"));
        }
        if let Some(age) = filter.min_age {
            v.delay("min_age", age.min(MAX_DELAY));
        }
        if let Some(k) = &filter.operation_key {
            v.key("operation_key", k);
        }
        v.finish()?;
        let limit = filter.limit as usize;
        filter.limit += 1;
        let mut jobs = self.shards().list_jobs(&filter).await?;
        let more = jobs.len() > limit;
        jobs.truncate(limit);
        let next = if more {
            jobs.last().map(|j| j.id)
        } else {
            None
        };
        Ok((jobs, next))
    }

    /// A job with its observations and events; `JobNotFound` if absent,
    /// `JobPruned` with its key record if retention removed it.
    pub async fn job_detail(&self, job_id: u64) -> Result<JobDetail, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(job_id);
        v.finish()?;
        let store = self.shards().for_job(job_id)?;
        let (job, observations) = match store.get_job(job_id).await {
            Ok(found) => found,
            Err(e) => return Err(self.explain(e, &jobfence_domain::scope::ANY_QUEUE).await),
        };
        let events = store.job_events(job_id).await?;
        Ok(JobDetail {
            job,
            observations,
            events,
        })
    }

    /// ResolveManualReview; see [`jobfence_store::JobStore::resolve_manual_review`].
    /// A resend (`RetryExecute`) needs `authorize_resend`: the operator
    /// takes on the risk that the provider's idempotency window is closed.
    pub async fn resolve_manual_review(
        &self,
        req: ResolveManualReview,
        authorize_resend: bool,
    ) -> Result<WriteOutcome, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.attempt(req.attempt);
        operator_fields(&mut v, &req.operator, &req.reason);
        match &req.resolution {
            Resolution::Succeeded {
                provider_reference,
                result,
            } => {
                v.key("provider_reference", provider_reference);
                if let Some(r) = result {
                    v.max_bytes("result", r, MAX_BODY_BYTES);
                }
            }
            Resolution::Failed => {}
            Resolution::RetryReconcile { delay } => v.delay("delay", *delay),
            Resolution::RetryExecute { delay } => {
                v.delay("delay", *delay);
                if !authorize_resend {
                    v.add(
                        "authorize_resend",
                        "must be true to send the operation again: the provider may no longer de-duplicate it",
                    );
                }
            }
        }
        v.finish()?;
        let result = match self.shards().for_job(req.job_id) {
            Ok(store) => match store.resolve_manual_review(&req).await {
                Err(e) => Err(self.explain(e, &jobfence_domain::scope::ANY_QUEUE).await),
                ok => ok,
            },
            Err(e) => Err(e),
        };
        let resolution = req.resolution.as_str();
        match &result {
            Ok(out) if !out.replayed => {
                let job = &out.job;
                tracing::Span::current().record("queue", job.queue.as_str());
                self.metrics().resolution(&job.queue, resolution);
                tracing::warn!(
                    job_id = job.id,
                    queue = %job.queue,
                    operation_key = %job.operation_key.escape_debug(),
                    attempt = req.attempt,
                    operator = %req.operator.escape_debug(),
                    resolution,
                    to_state = %job.state,
                    reason = %req.reason.escape_debug(),
                    "manual review resolved by operator"
                );
            }
            Ok(_) => {}
            Err(e) => {
                self.metrics().commit_outcome("ResolveManualReview", e);
                tracing::info!(
                    job_id = req.job_id,
                    presented_attempt = req.attempt,
                    operator = %req.operator.escape_debug(),
                    resolution,
                    error = %e,
                    "manual review resolution refused"
                );
            }
        }
        result
    }

    /// CancelJob; see [`jobfence_store::JobStore::cancel_job`].
    pub async fn cancel_job(&self, req: CancelJob) -> Result<WriteOutcome, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        operator_fields(&mut v, &req.operator, &req.reason);
        v.finish()?;
        let result = match self.shards().for_job(req.job_id) {
            Ok(store) => match store.cancel_job(&req).await {
                Err(e) => Err(self.explain(e, &jobfence_domain::scope::ANY_QUEUE).await),
                ok => ok,
            },
            Err(e) => Err(e),
        };
        match &result {
            Ok(out) if !out.replayed => {
                let job = &out.job;
                self.metrics().cancellation(&job.queue);
                tracing::warn!(
                    job_id = job.id,
                    queue = %job.queue,
                    operation_key = %job.operation_key.escape_debug(),
                    operator = %req.operator.escape_debug(),
                    reason = %req.reason.escape_debug(),
                    "job cancelled by operator"
                );
            }
            Ok(_) => {}
            Err(e) => {
                self.metrics().commit_outcome("CancelJob", e);
                tracing::info!(job_id = req.job_id, operator = %req.operator.escape_debug(), error = %e, "cancel refused");
            }
        }
        result
    }

    /// The state changes of the last `window` on every database, per
    /// queue and 5-second bucket (see [`jobfence_store::trends`]): what
    /// the console's trend lines are rebuilt from.
    pub async fn state_changes(
        &self,
        window: Duration,
    ) -> Result<Vec<jobfence_domain::admin::StateChange>, CoordinatorError> {
        let mut out = Vec::new();
        for (_, store) in self.shards().all() {
            out.extend(store.state_changes(window).await?);
        }
        Ok(out)
    }

    /// QueueStats; `window` None means [`DEFAULT_STATS_WINDOW`]. Each
    /// queue says what holds its ready jobs when its provider does (an
    /// operator's pause with since when and by whom, a throttle, the
    /// in-flight cap, a spent budget).
    pub async fn queue_stats(
        &self,
        queue: Option<String>,
        window: Option<Duration>,
    ) -> Result<(Vec<QueueStats>, Duration), CoordinatorError> {
        let mut v = Violations::default();
        if let Some(q) = &queue {
            v.queue("queue", q);
        }
        let window = window.unwrap_or(DEFAULT_STATS_WINDOW);
        if window.is_zero() {
            v.add("window", "must be positive");
        }
        v.delay("window", window);
        v.finish()?;
        let mut stats = self.shards().queue_stats(queue.as_deref(), window).await?;
        // Where the work waits, say why: each queue's provider's hold.
        let holds: std::collections::HashMap<String, _> = self
            .list_providers()
            .await?
            .into_iter()
            .filter_map(|p| p.hold().map(|h| (p.queues, h)))
            .flat_map(|(queues, h)| queues.into_iter().map(move |q| (q, h.clone())))
            .collect();
        // The queue's own pause comes first: no provider could hand out.
        let paused: std::collections::HashMap<String, _> = self
            .paused_queues()
            .await?
            .into_iter()
            .map(|p| {
                let hold = QueueHold {
                    provider: String::new(),
                    kind: HoldKind::QueuePaused,
                    why: format!("queue {} paused: {}", p.queue, p.reason),
                    since: Some(p.since),
                    by: Some(p.by),
                };
                (p.queue, hold)
            })
            .collect();
        for s in &mut stats {
            s.held = paused.get(&s.queue).or(holds.get(&s.queue)).cloned();
        }
        Ok((stats, window))
    }

    /// ListEvents: `limit` 0 means [`DEFAULT_EVENTS_PAGE`].
    pub async fn list_events(
        &self,
        after: u64,
        limit: u32,
        queue: Option<&str>,
    ) -> Result<FeedPage, CoordinatorError> {
        let mut v = Violations::default();
        if let Some(q) = queue {
            v.queue("queue", q);
        }
        if limit > MAX_EVENTS_PAGE {
            v.add("limit", format!("must be at most {MAX_EVENTS_PAGE}"));
        }
        v.finish()?;
        let limit = if limit == 0 {
            DEFAULT_EVENTS_PAGE
        } else {
            limit
        };
        self.feed_of(after)?.list_events(after, limit, queue).await
    }

    /// The database whose feed a cursor reads: with several databases an
    /// event id (and so a cursor) carries its database's number, and each
    /// database's feed is followed on its own (see [`Self::feed_starts`]).
    fn feed_of(&self, cursor: u64) -> Result<&jobfence_store::JobStore, CoordinatorError> {
        let shards = self.shards();
        match shards.index_for_id(cursor) {
            Ok(i) => Ok(shards.at(i)),
            Err(_) => Err(CoordinatorError::InvalidArgument(vec![
                jobfence_domain::FieldViolation::new(
                    "after_event_id",
                    format!(
                        "names database {}, which this coordinator does not have",
                        jobfence_store::shards::shard_of(cursor)
                    ),
                ),
            ])),
        }
    }

    /// The cursor that reads each database's feed from its beginning, one
    /// per database: `[0]` for one database alone, `k·2^48` for database
    /// `k` of a shards file.
    pub fn feed_starts(&self) -> Vec<u64> {
        let shards = self.shards();
        shards
            .all()
            .iter()
            .map(|(n, _)| {
                if shards.is_sharded() {
                    jobfence_store::shards::range_start(*n)
                } else {
                    0
                }
            })
            .collect()
    }

    /// One cursor per database (see [`Self::feed_starts`]) `back` events
    /// before its newest one, never before its start: where a reader of
    /// every database's latest events (the console's Events page) begins.
    pub async fn latest_event_cursors(&self, back: u64) -> Result<Vec<u64>, CoordinatorError> {
        let mut cursors = Vec::new();
        for ((_, store), start) in self.shards().all().iter().zip(self.feed_starts()) {
            let last = store.last_event_id().await?;
            cursors.push(last.saturating_sub(back).max(start));
        }
        Ok(cursors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_name_and_reason_are_required() {
        let mut v = Violations::default();
        operator_fields(&mut v, "", " ");
        let fields: Vec<_> = v.0.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["operator", "reason"]);
        let mut v = Violations::default();
        operator_fields(&mut v, "alice", "confirmed in the provider dashboard");
        assert!(v.0.is_empty());
    }
}
