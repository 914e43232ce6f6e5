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

pub mod round;
mod rules;

use super::batch::{self, Change};
use super::events::{self, call_digest, CallKey, NewEvent};
use super::pause::PausePoint;
use super::reads::LockedJob;
use super::tx::Tx;
use super::{micros, JobStore};
use jobfence_domain::event::parse_fail_detail;
use jobfence_domain::write_plan::{self, AppliedWrite, WritePlan};
use jobfence_domain::{
    Complete, CoordinatorError, DbTime, EventKind, Fail, FailDisposition, FailOutcome,
    FencedOutcome, FencedWrite, JobState, OverrideReason, QueuePolicies, QueueScope, RenewLease,
    ScopedWrite, WriteOutcome,
};
use rules::RoundRules;
use std::collections::HashMap;
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

    /// The first half of a round's transaction, in `tx`: locks the rows
    /// (by primary key, in id order), decides each call on its own locked
    /// row (the fence) and finds replays; the new images
    /// ([`OpenRound::changes`]), the events ([`OpenRound::events`]) and
    /// the COMMIT are the caller's. `locked`: the round's rows when the
    /// caller locked them already, in this transaction (a handoff sends
    /// the lock with its claim's reads), and when it began to.
    pub(crate) async fn open_round<'w>(
        &self,
        tx: &mut Tx,
        writes: &'w [ScopedWrite],
        round: &[usize],
        policies: &QueuePolicies,
        locked: Option<Prelocked>,
    ) -> Result<OpenRound<'w>, CoordinatorError> {
        let ids: Vec<u64> = round.iter().map(|&i| writes[i].write.job_id()).collect();
        let Some((locked, now)) = lock_round(tx, &ids, locked).await? else {
            return Ok(OpenRound {
                locked: HashMap::new(),
                now: None,
                plans: ids.into_iter().map(Plan::NotFound).collect(),
                throttles: Vec::new(),
            });
        };
        self.pause(PausePoint::WriteAfterLock).await;
        let rules = RoundRules::read(tx, writes, round, &locked, policies).await?;
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
        mark_replays(tx, &mut plans).await?;
        Ok(OpenRound {
            locked,
            now: Some(now),
            plans,
            throttles,
        })
    }
}

/// A round whose calls are decided and whose new images are written in
/// its transaction, not yet committed (see [`JobStore::open_round`]).
pub(crate) struct OpenRound<'w> {
    locked: HashMap<u64, LockedJob>,
    /// The clock the round stamps; `None` when not one job exists.
    now: Option<DbTime>,
    plans: Vec<Plan<'w>>,
    /// The statements that hold throttled providers, sent with the COMMIT.
    pub(crate) throttles: Vec<String>,
}

impl OpenRound<'_> {
    /// One event per call that wrote or was refused, to append with the
    /// COMMIT; replays, unknown jobs and forbidden calls have none.
    pub(crate) fn events(&self) -> Vec<NewEvent<'_>> {
        let Some(now) = self.now else {
            return Vec::new();
        };
        self.plans
            .iter()
            .filter_map(|p| p.event(&self.locked, now))
            .collect()
    }

    /// The new images of the calls that apply.
    pub(crate) fn changes(&self) -> Vec<Change<'_>> {
        self.plans
            .iter()
            .filter_map(|p| match p {
                Plan::Apply { applied, .. } => Some(Change {
                    before: &self.locked[&applied.after.id].job,
                    after: &applied.after,
                }),
                _ => None,
            })
            .collect()
    }

    /// The jobs the round locked (those of its calls that exist).
    pub(crate) fn locked_ids(&self) -> Vec<u64> {
        self.locked.keys().copied().collect()
    }

    /// Whether call `k` of the round (in round order) is a replay of a
    /// call applied before.
    pub(crate) fn is_replay(&self, k: usize) -> bool {
        matches!(self.plans.get(k), Some(Plan::Replay { .. }))
    }

    /// Whether call `k` of the round names a job of a queue outside its
    /// caller's scope (refused `QueueNotAllowed`, nothing written).
    pub(crate) fn is_forbidden(&self, k: usize) -> bool {
        matches!(self.plans.get(k), Some(Plan::Forbidden(_)))
    }

    /// Each call's answer once the transaction ended, in round order;
    /// `commit_error` is set when the COMMIT's outcome is unknown.
    pub(crate) fn answers(self, commit_error: Option<&CoordinatorError>) -> Vec<WriteResult> {
        let locked = self.locked;
        self.plans
            .into_iter()
            .map(|p| p.answer(&locked, commit_error))
            .collect()
    }
}

/// A round's rows, locked by the caller in the round's transaction, and
/// when it began to lock them.
pub(crate) type Prelocked = (HashMap<u64, LockedJob>, Instant);

/// Locks the rows of a round (unless `prelocked`) and reads the DB clock:
/// `None` when not one of the jobs exists. A round whose locks took long
/// re-reads the clock (a lease must start when it is given, not when the
/// round began to wait).
async fn lock_round(
    tx: &mut Tx,
    ids: &[u64],
    prelocked: Option<Prelocked>,
) -> Result<Option<(HashMap<u64, LockedJob>, DbTime)>, CoordinatorError> {
    let (locked, started) = match prelocked {
        Some(p) => p,
        None => {
            let started = Instant::now();
            (batch::lock_jobs(tx, ids).await?, started)
        }
    };
    let now = match locked.values().next() {
        Some(_) if started.elapsed() > STALE_NOW => batch::db_now(tx).await?,
        Some(l) => l.now,
        None => return Ok(None),
    };
    Ok(Some((locked, now)))
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
