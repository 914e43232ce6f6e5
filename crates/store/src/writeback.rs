//! The fenced writes: RenewLease, Complete and Fail. This is where a write
//! back is fenced, one call at a time or as a group commit.
//!
//! A batch of writes to different jobs is one short transaction: lock the
//! rows by primary key (in id order), apply the fencing rule
//! (`domain::fence::check`) to each locked row on its own, write the new
//! image of every row whose caller holds it with one UPDATE that still
//! carries `id + state + attempt` per row, append one event per call, and
//! commit. Each call's answer depends on its own row only (docs/design.md rule
//! 8): a caller that does not hold its job is told exactly why (superseded
//! by attempt N, not running) and the others apply; a call applied before
//! (a replay after a lost response) is answered OK without writing; every
//! refusal is logged as a `stale_write_rejected` event. A commit whose
//! outcome is unknown is unknown for every write in it (rule 4).

use super::batch::{self, Change};
use super::events::{self, call_digest, CallKey, NewEvent};
use super::pause::PausePoint;
use super::reads::LockedJob;
use super::tx::Tx;
use super::{micros, JobStore};
use jobfence_domain::event::parse_fail_detail;
use jobfence_domain::write_plan::{self, AppliedWrite, WritePlan};
use jobfence_domain::{
    transition, Complete, CoordinatorError, DbTime, EventKind, Fail, FailDisposition, FailOutcome,
    FencedOutcome, FencedWrite, JobState, OverrideReason, QueuePolicies, QueuePolicy, QueueScope,
    RenewLease, ScopedWrite, WriteOutcome,
};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// A batch whose row locks took longer than this to get re-reads the DB
/// clock before stamping its changes (a lease must start when it is given,
/// not when the batch began to wait).
const STALE_NOW: Duration = Duration::from_millis(50);

/// The answer to one call of a batch.
pub type WriteResult = Result<FencedOutcome, CoordinatorError>;

impl JobStore {
    /// Extends the lease of the current attempt (see `RenewLease`).
    pub async fn renew_lease(&self, req: &RenewLease) -> Result<WriteOutcome, CoordinatorError> {
        let out = self.write_one(FencedWrite::RenewLease(req.clone())).await?;
        Ok(WriteOutcome {
            job: out.job,
            replayed: out.replayed,
        })
    }

    /// Marks the job succeeded with the provider's reference and result.
    pub async fn complete(&self, req: &Complete) -> Result<WriteOutcome, CoordinatorError> {
        let out = self.write_one(FencedWrite::Complete(req.clone())).await?;
        Ok(WriteOutcome {
            job: out.job,
            replayed: out.replayed,
        })
    }

    /// Applies a failure disposition; a resend outside the queue's resend
    /// window, or past its max dispatches, goes to manual review instead.
    pub async fn fail(
        &self,
        req: &Fail,
        policies: &QueuePolicies,
    ) -> Result<FailOutcome, CoordinatorError> {
        let out = self
            .write_batch(&[FencedWrite::Fail(req.clone())], policies)
            .await
            .pop()
            .unwrap_or(Err(CoordinatorError::Unanswered { what: "write" }))?;
        out.into_fail()
    }

    async fn write_one(&self, write: FencedWrite) -> WriteResult {
        self.write_batch(&[write], &QueuePolicies::default())
            .await
            .pop()
            .unwrap_or(Err(CoordinatorError::Unanswered { what: "write" }))
    }

    /// [`write_scoped_batch`](Self::write_scoped_batch) for callers that
    /// may write to every queue.
    pub async fn write_batch(
        &self,
        writes: &[FencedWrite],
        policies: &QueuePolicies,
    ) -> Vec<WriteResult> {
        let scoped: Vec<ScopedWrite> = writes
            .iter()
            .cloned()
            .map(ScopedWrite::unrestricted)
            .collect();
        self.write_scoped_batch(&scoped, policies).await
    }

    /// Applies `writes` as group commits and answers each one, in order.
    ///
    /// A call whose caller's scope does not cover its job's queue (read
    /// under the row lock) is refused `QueueNotAllowed` and writes nothing,
    /// not even a refusal event.
    ///
    /// Calls to different jobs share one transaction. Calls to the same job
    /// (a retry racing its original, a renewal racing a Complete) are
    /// applied one after the other, in order, each in the next
    /// transaction, so the later one sees what the earlier one did. A
    /// deadlock or lock wait timeout rolls a transaction back and it is run
    /// again (up to 3 times, then `TransactionConflict` for each of its
    /// calls); `policies` decide the resends of Fail.
    pub async fn write_scoped_batch(
        &self,
        writes: &[ScopedWrite],
        policies: &QueuePolicies,
    ) -> Vec<WriteResult> {
        let mut answers: Vec<Option<WriteResult>> = (0..writes.len()).map(|_| None).collect();
        let mut rest: Vec<usize> = (0..writes.len()).collect();
        while !rest.is_empty() {
            let mut jobs = HashSet::new();
            let (round, later): (Vec<usize>, Vec<usize>) = rest
                .iter()
                .partition(|&&i| jobs.insert(writes[i].write.job_id()));
            let done = self
                .retry_conflicts(|| self.write_round(writes, &round, policies))
                .await;
            match done {
                Ok(round_answers) => {
                    for (i, answer) in round.iter().zip(round_answers) {
                        answers[*i] = Some(answer);
                    }
                }
                Err(e) => {
                    for i in &round {
                        answers[*i] = Some(Err(e.clone()));
                    }
                }
            }
            rest = later;
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(CoordinatorError::Unanswered { what: "write" })))
            .collect()
    }

    /// One transaction over calls to distinct jobs (`round` indexes
    /// `writes`). `Err` is for the whole transaction (nothing applied, or
    /// the commit's outcome unknown where `Ok` would claim otherwise).
    async fn write_round(
        &self,
        writes: &[ScopedWrite],
        round: &[usize],
        policies: &QueuePolicies,
    ) -> Result<Vec<WriteResult>, CoordinatorError> {
        let ids: Vec<u64> = round.iter().map(|&i| writes[i].write.job_id()).collect();
        let mut tx = self.begin_batch().await?;
        let Some((locked, now)) = lock_round(&mut tx, &ids).await? else {
            // Not one of the jobs exists.
            tx.rollback().await?;
            return Ok(ids
                .iter()
                .map(|&job_id| Err(CoordinatorError::JobNotFound { job_id }))
                .collect());
        };
        self.pause(PausePoint::WriteAfterLock).await;
        let rules = RoundRules::read(&mut tx, writes, round, &locked, policies).await?;
        // Decide each call on its own locked row.
        let mut plans: Vec<Plan> = round
            .iter()
            .map(|&i| {
                let ScopedWrite { write, scope } = &writes[i];
                plan(
                    write,
                    scope,
                    locked.get(&write.job_id()),
                    rules.policies(policies),
                    now,
                )
            })
            .collect();
        let throttles = rules.hold_throttled(&mut plans, &locked, now)?;
        mark_replays(&mut tx, &mut plans).await?;
        let commit_error = self
            .write_and_commit(tx, &plans, &locked, &throttles, now)
            .await?;
        Ok(plans
            .into_iter()
            .map(|p| p.answer(&locked, commit_error.as_ref()))
            .collect())
    }

    /// Writes every change and every event of a round, the events in the
    /// round trip of the COMMIT. `Ok(Some(e))`: the COMMIT's outcome is
    /// unknown (`e`); `Err`: nothing was applied.
    async fn write_and_commit(
        &self,
        mut tx: Tx,
        plans: &[Plan<'_>],
        locked: &HashMap<u64, LockedJob>,
        throttles: &[String],
        now: DbTime,
    ) -> Result<Option<CoordinatorError>, CoordinatorError> {
        let changes: Vec<Change> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Apply { applied, .. } => Some(Change {
                    before: &locked[&applied.after.id].job,
                    after: &applied.after,
                }),
                _ => None,
            })
            .collect();
        batch::write_images(&mut tx, &changes).await?;
        let new_events: Vec<NewEvent> = plans.iter().filter_map(|p| p.event(locked, now)).collect();
        drop(changes);
        self.pause_in(PausePoint::WriteBeforeCommit, &mut tx).await;
        // Replays, unknown jobs and forbidden calls write nothing; every
        // other call has its event, appended in the round trip of the
        // COMMIT.
        if new_events.is_empty() {
            tx.rollback().await?;
            return Ok(None);
        }
        match events::append_and_commit_with(tx, &new_events, throttles).await {
            Ok(()) => Ok(None),
            Err(e @ CoordinatorError::CommitOutcomeUnknown(_)) => Ok(Some(e)),
            // A conflict, or refused before COMMIT ran: nothing applied.
            Err(e) => Err(e),
        }
    }
}

/// Locks the rows of a round and reads the DB clock: `None` when not one
/// of the jobs exists. A round whose locks took long re-reads the clock (a
/// lease must start when it is given, not when the round began to wait).
async fn lock_round(
    tx: &mut Tx,
    ids: &[u64],
) -> Result<Option<(HashMap<u64, LockedJob>, DbTime)>, CoordinatorError> {
    let started = Instant::now();
    let locked = batch::lock_jobs(tx, ids).await?;
    let now = match locked.values().next() {
        Some(_) if started.elapsed() > STALE_NOW => batch::db_now(tx).await?,
        Some(l) => l.now,
        None => return Ok(None),
    };
    Ok(Some((locked, now)))
}

/// The stored rules of a round's queues: a resend is decided on the
/// queue's stored policy (docs/design.md rule 13), and a throttle report names
/// the queue's provider. Read in the round's transaction, only when a call
/// needs them.
struct RoundRules {
    stored: HashMap<String, (Option<QueuePolicy>, Option<String>)>,
    /// The coordinator's policies with the stored ones over them, when any
    /// is stored.
    merged: Option<QueuePolicies>,
}

impl RoundRules {
    async fn read(
        tx: &mut Tx,
        writes: &[ScopedWrite],
        round: &[usize],
        locked: &HashMap<u64, LockedJob>,
        policies: &QueuePolicies,
    ) -> Result<RoundRules, CoordinatorError> {
        let needs_rules: Vec<&str> = round
            .iter()
            .filter_map(|&i| match &writes[i].write {
                FencedWrite::Fail(f)
                    if f.disposition == FailDisposition::RetryExecute
                        || f.provider_retry_after.is_some() =>
                {
                    locked.get(&f.job_id).map(|l| l.job.queue.as_str())
                }
                _ => None,
            })
            .collect();
        let stored = queue_rules(tx, &needs_rules).await?;
        let merged = stored.values().any(|(p, _)| p.is_some()).then(|| {
            let mut merged = policies.clone();
            for (queue, (policy, _)) in &stored {
                if let Some(p) = policy {
                    merged.by_queue.insert(queue.clone(), *p);
                }
            }
            merged
        });
        Ok(RoundRules { stored, merged })
    }

    /// The policies the round decides resends on.
    fn policies<'a>(&'a self, flags: &'a QueuePolicies) -> &'a QueuePolicies {
        self.merged.as_ref().unwrap_or(flags)
    }

    /// Applied Fails that report the provider's Retry-After hold its
    /// hand-outs until then, on every coordinator, committed with them:
    /// the statements to send with the COMMIT.
    fn hold_throttled(
        &self,
        plans: &mut [Plan<'_>],
        locked: &HashMap<u64, LockedJob>,
        now: DbTime,
    ) -> Result<Vec<String>, CoordinatorError> {
        let mut throttles = Vec::new();
        for p in plans.iter_mut() {
            if let Plan::Apply {
                applied:
                    AppliedWrite {
                        after,
                        throttle: Some(retry_after),
                        ..
                    },
                throttled,
                ..
            } = p
            {
                let queue = locked[&after.id].job.queue.as_str();
                if let Some((_, Some(provider))) = self.stored.get(queue) {
                    throttles.push(throttle_statement(provider, *retry_after, now)?);
                    *throttled = Some(provider.clone());
                }
            }
        }
        Ok(throttles)
    }
}

/// Refused calls that are this very call applied before (a replay after a
/// lost response) become replays: one look in the events for all of them.
/// A renewal is never answered as a replay: a heartbeat repeats the very
/// same call many times, each one applied, so an earlier one would tell a
/// superseded holder its lease was renewed.
async fn mark_replays(tx: &mut Tx, plans: &mut [Plan<'_>]) -> Result<(), CoordinatorError> {
    let keys: Vec<CallKey> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Refuse { write, digest, .. } if !matches!(write, FencedWrite::RenewLease(_)) => {
                Some(CallKey::new(write.job_id(), write.attempt(), digest))
            }
            _ => None,
        })
        .collect();
    let applied_before = events::find_applied_all(tx, &keys).await?;
    for p in plans.iter_mut() {
        if let Plan::Refuse { write, .. } = p {
            if matches!(write, FencedWrite::RenewLease(_)) {
                continue;
            }
            if let Some((_, detail)) = applied_before.get(&write.job_id()) {
                *p = Plan::Replay {
                    job_id: write.job_id(),
                    fail: match write {
                        FencedWrite::Fail(_) => detail.as_deref().and_then(parse_fail_detail),
                        _ => None,
                    },
                };
            }
        }
    }
    Ok(())
}

/// What a round does with one call: the domain's decision
/// ([`write_plan::plan`]), with what the transaction adds to it (the call's
/// digest, the provider a throttle report held, a replay found in the
/// events).
// Nearly every plan is an `Apply`: boxing it would only add an allocation
// per call.
#[allow(clippy::large_enum_variant)]
enum Plan<'a> {
    /// No such job.
    NotFound(u64),
    /// The job's queue is outside the caller's scope: nothing is written.
    Forbidden(CoordinatorError),
    /// The caller holds the job: write the new image and log its event.
    Apply {
        write: &'a FencedWrite,
        applied: AppliedWrite,
        digest: [u8; 32],
        /// The provider the call's throttle report held (set once it is
        /// written).
        throttled: Option<String>,
    },
    /// The caller does not hold the job (unless the events show this very
    /// call was applied before).
    Refuse {
        write: &'a FencedWrite,
        digest: [u8; 32],
        why: CoordinatorError,
    },
    /// This exact call was applied before: answer OK, write nothing (for
    /// a Fail, with what was applied then, read from its event).
    Replay {
        job_id: u64,
        fail: Option<(FailDisposition, Option<OverrideReason>)>,
    },
}

fn plan<'a>(
    write: &'a FencedWrite,
    scope: &QueueScope,
    locked: Option<&LockedJob>,
    policies: &QueuePolicies,
    now: DbTime,
) -> Plan<'a> {
    match write_plan::plan(
        write,
        scope,
        locked.map(|l| (&l.job, l.dispatch)),
        policies,
        now,
    ) {
        WritePlan::NotFound(job_id) => Plan::NotFound(job_id),
        WritePlan::Forbidden(e) => Plan::Forbidden(e),
        WritePlan::Refuse(why) => Plan::Refuse {
            write,
            digest: digest(write),
            why,
        },
        WritePlan::Apply(applied) => Plan::Apply {
            write,
            applied,
            digest: digest(write),
            throttled: None,
        },
    }
}

impl Plan<'_> {
    /// The event this call leaves: its transition, or its refusal.
    fn event<'a>(&self, locked: &'a HashMap<u64, LockedJob>, now: DbTime) -> Option<NewEvent<'a>> {
        match self {
            Plan::Apply {
                write,
                applied,
                digest,
                ..
            } => Some(NewEvent {
                job_id: applied.after.id,
                queue: &locked[&applied.after.id].job.queue,
                attempt: write.attempt(),
                kind: applied.kind,
                from_state: Some(JobState::Running),
                to_state: Some(applied.after.state),
                current_attempt: write.attempt(),
                request_digest: Some(*digest),
                detail: applied.detail.clone(),
                created_at: now,
            }),
            Plan::Refuse { write, why, .. } => Some(events::refusal(
                &locked[&write.job_id()].job,
                write.attempt(),
                EventKind::StaleWriteRejected,
                format!("{}: {why}", digest_name(write)),
                now,
            )),
            _ => None,
        }
    }

    /// The caller's answer once the transaction ended; `commit_error` is
    /// set when the COMMIT's outcome is unknown.
    fn answer(
        self,
        locked: &HashMap<u64, LockedJob>,
        commit_error: Option<&CoordinatorError>,
    ) -> WriteResult {
        match self {
            Plan::NotFound(job_id) => Err(CoordinatorError::JobNotFound { job_id }),
            Plan::Forbidden(e) => Err(e),
            Plan::Apply {
                applied, throttled, ..
            } => match commit_error {
                Some(e) => Err(e.clone()),
                None => Ok(FencedOutcome {
                    job: applied.after,
                    replayed: false,
                    fail: applied.fail,
                    throttled,
                }),
            },
            // Nothing of the job changed: the refusal stands even if its
            // audit entry was not committed.
            Plan::Refuse { why, write, .. } => {
                if let Some(e) = commit_error {
                    tracing::warn!(job_id = write.job_id(), error = %e, "could not log a refused write");
                }
                Err(why)
            }
            Plan::Replay { job_id, fail } => Ok(FencedOutcome {
                job: locked[&job_id].job.clone(),
                replayed: true,
                fail,
                throttled: None,
            }),
        }
    }
}

/// The stored rules of `queues`, read in the write's transaction (a
/// plain read: they change only by an operator's call): each queue's
/// stored resend policy and its provider. Empty without a query when
/// `queues` is.
async fn queue_rules(
    conn: &mut sqlx::MySqlConnection,
    queues: &[&str],
) -> Result<
    std::collections::HashMap<String, (Option<QueuePolicy>, Option<String>)>,
    CoordinatorError,
> {
    let mut out = std::collections::HashMap::new();
    if queues.is_empty() {
        return Ok(out);
    }
    let sql = include_str!("queries/queue_policies/write_rules.sql")
        .replace("{queues}", &super::reads::placeholders(queues.len()));
    let mut q = sqlx::query(&sql);
    for queue in queues {
        q = q.bind(*queue);
    }
    for row in q.fetch_all(conn).await.map_err(super::convert_sqlx_err)? {
        out.insert(
            super::rows::text(&row, "queue")?,
            (
                super::budget::stored_policy(&row)?,
                super::rows::opt_text(&row, "provider")?,
            ),
        );
    }
    Ok(out)
}

/// The statement that holds `provider`'s hand-outs for `retry_after` from
/// `now` (never shortening a longer hold already stored), counting the
/// report.
fn throttle_statement(
    provider: &str,
    retry_after: Duration,
    now: DbTime,
) -> Result<String, CoordinatorError> {
    let until = super::literal::time(transition::after(now, retry_after));
    Ok(include_str!("queries/providers/throttle.sql")
        .replace("{until}", &until)
        .replace("{provider}", &super::literal::provider(provider)?))
}

/// The call's name inside its digest and refusal detail (kept from the
/// first schema, so replays of calls made before an upgrade still match).
fn digest_name(write: &FencedWrite) -> &'static str {
    match write {
        FencedWrite::RenewLease(_) => "renew_lease",
        FencedWrite::Complete(_) => "complete",
        FencedWrite::Fail(_) => "fail",
    }
}

/// The identity of this exact call, for replay detection.
fn digest(write: &FencedWrite) -> [u8; 32] {
    let (job_id, attempt) = (write.job_id().to_be_bytes(), write.attempt().to_be_bytes());
    let name = digest_name(write).as_bytes();
    match write {
        FencedWrite::RenewLease(r) => {
            call_digest(&[name, &job_id, &attempt, &micros(r.lease).to_be_bytes()])
        }
        FencedWrite::Complete(r) => call_digest(&[
            name,
            &job_id,
            &attempt,
            r.provider_reference.as_deref().unwrap_or("").as_bytes(),
            r.result.as_deref().unwrap_or("").as_bytes(),
        ]),
        FencedWrite::Fail(r) => call_digest(&[
            name,
            &job_id,
            &attempt,
            r.disposition.as_str().as_bytes(),
            r.error.as_bytes(),
            &micros(r.retry_delay).to_be_bytes(),
        ]),
    }
}
