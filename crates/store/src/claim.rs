//! Claim and Takeover: the two ways to get a new attempt (fencing token).
//!
//! Both lock the rows (`SELECT … FOR UPDATE`, by scan with SKIP LOCKED or
//! by primary key), re-check the state under the lock, add one to
//! `attempt` and commit at once. Only a committed claim counts: if the
//! commit's outcome is unknown the caller is told so and must not act on
//! the job.
//!
//! Concurrent Claims of one queue are coalesced by the coordinator into one
//! claim transaction ([`JobStore::claim_batch`]): one scan for all of them,
//! the rows handed out to each caller in turn, one UPDATE (fenced row by
//! row) and one event insert for the whole batch.

use super::batch::{self, with_job_columns, Change};
use super::budget::{self, LockedProvider, Rules};
use super::events::{self, NewEvent};
use super::literal;
use super::pause::PausePoint;
use super::reads::{self, LockedJob};
use super::{commit, convert_sqlx_err, JobStore};
use jobfence_domain::budget::BudgetReport;
use jobfence_domain::budget::{Allowance, Holdback};
use jobfence_domain::policy::{claim_action, ClaimDecision};
use jobfence_domain::{
    transition, ClaimSlot, ClaimedJob, CoordinatorError, DbTime, EventKind, Job, JobState,
    NextAction, QueuePolicy, QueueScope, TakeoverRequest,
};
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

static SCAN_EXPIRED: LazyLock<String> =
    LazyLock::new(|| with_job_columns(include_str!("queries/jobs/scan_expired.sql")));
static SCAN_READY: LazyLock<String> =
    LazyLock::new(|| with_job_columns(include_str!("queries/jobs/scan_ready.sql")));

/// What a claim transaction read in its first round trip.
struct Scan {
    rules: Rules,
    /// Running jobs whose lease expired (inline takeovers), then due
    /// ready jobs.
    expired: Vec<LockedJob>,
    ready: Vec<LockedJob>,
}

/// The queue's stored rules (its provider's row locked first; see
/// `budget.rs`) and both claim scans, as one text query (one round trip):
/// running jobs whose lease expired, then due ready jobs, each up to
/// `limit` rows and locked with SKIP LOCKED. When the first scan finds
/// some, the second may lock a few more ready rows than are handed out;
/// they are released at the claim's commit, as are rows the budget holds
/// back. `reconcile_only` limits the ready scan to jobs whose next action
/// is `reconcile` (a provider whose sends are paused).
async fn scan(
    conn: &mut MySqlConnection,
    queue: &str,
    limit: u32,
    reconcile_only: bool,
) -> Result<Scan, CoordinatorError> {
    let q = literal::queue(queue)?;
    let fill = |sql: &str| {
        sql.replace("{queue}", &q)
            .replace("{limit}", &limit.to_string())
            .replace(
                "{only}",
                if reconcile_only {
                    "AND next_action = 'reconcile'"
                } else {
                    ""
                },
            )
    };
    let mut statements = budget::rules_statements(queue)?;
    statements.push(fill(&SCAN_EXPIRED));
    statements.push(fill(&SCAN_READY));
    let mut sets = batch::result_sets(conn, &statements.join(";\n")).await?;
    if sets.len() != budget::RULES_RESULTS + 2 {
        return Err(CoordinatorError::Internal(format!(
            "a claim's scan gave {} result sets",
            sets.len()
        )));
    }
    let ready = locked_jobs(&sets.pop().unwrap_or_default())?;
    let expired = locked_jobs(&sets.pop().unwrap_or_default())?;
    let rules = Rules::parse(queue, &sets)?;
    Ok(Scan {
        rules,
        expired,
        ready,
    })
}

fn locked_jobs(rows: &[MySqlRow]) -> Result<Vec<LockedJob>, CoordinatorError> {
    rows.iter().map(batch::locked_job).collect()
}

/// Most jobs one claim transaction takes; the coordinator splits larger
/// coalesced claims.
pub const MAX_CLAIM_TRANSACTION_JOBS: u32 = 256;

/// What a coalesced claim handed out: the jobs of each slot, in the order
/// of the slots, and, when asked for and some slot got fewer jobs than it
/// wanted, how long until it is worth asking again (`Some(ZERO)`: already;
/// `None`: nothing pending, or only an operator can change it): when the
/// next job of the queue becomes claimable or, if the provider's budget
/// held due jobs back, when its next unit is due.
#[derive(Debug, Default)]
pub struct ClaimBatch {
    pub jobs: Vec<Vec<ClaimedJob>>,
    pub next_due: Option<Duration>,
    /// What the claim did against its provider's budget, when the queue
    /// dispatches to one.
    pub budget: Option<BudgetReport>,
    /// Due resends parked in manual review instead of being handed out
    /// (their window would close within the lease; docs/design.md rule 6).
    pub parked: Vec<Job>,
}

/// A job a claim decided on: handed to slot `slot`, or parked.
struct Decided<'a> {
    locked: &'a LockedJob,
    after: Job,
    /// `None`: parked in manual review, not handed out.
    slot: Option<usize>,
}

impl JobStore {
    /// One claim transaction for several callers of one queue: first
    /// running jobs whose lease expired (inline takeover, next_action
    /// `reconcile`), then due ready jobs, oldest first, handed out to the
    /// slots in order (each up to its `max_jobs`). Rows locked by a
    /// concurrent claim are skipped, so two claims never get the same job.
    ///
    /// `policy` is the coordinator's default for the queue; a policy stored
    /// in the database wins (docs/design.md rule 13). When the queue dispatches
    /// to a provider, the transaction locks the provider's row and hands
    /// out only what its budget allows now (rules 11 and 12): each job
    /// spends the cost of its next action, and the units are spent in the
    /// same COMMIT as the hand-outs, so a claim that does not commit spends
    /// nothing. A due resend whose window would close within the lease is
    /// parked in manual review instead (rule 6). With `want_next_due`, a
    /// batch that left a slot short also says when to look again.
    ///
    /// Errors are for every slot: `CommitOutcomeUnknown` (nobody may act on
    /// what the batch would have handed out; the units it would have spent
    /// may or may not be spent, exactly as its hand-outs may or may not be
    /// committed), `DatabaseUnavailable`, `TransactionConflict` after 3
    /// tries.
    pub async fn claim_batch(
        &self,
        queue: &str,
        policy: QueuePolicy,
        slots: &[ClaimSlot],
        want_next_due: bool,
    ) -> Result<ClaimBatch, CoordinatorError> {
        self.retry_conflicts(|| self.claim_once(queue, policy, slots, want_next_due))
            .await
    }

    async fn claim_once(
        &self,
        queue: &str,
        default_policy: QueuePolicy,
        slots: &[ClaimSlot],
        want_next_due: bool,
    ) -> Result<ClaimBatch, CoordinatorError> {
        let wanted: u32 = slots.iter().map(|s| s.max_jobs).sum();
        let mut tx = self.begin_batch().await?;
        let Scan {
            rules,
            expired: mut candidates,
            ready,
        } = scan(&mut tx, queue, wanted, false).await?;
        let room = (wanted as usize).saturating_sub(candidates.len());
        candidates.extend(ready.into_iter().take(room));
        self.pause(PausePoint::ClaimAfterScan).await;
        let provider = rules.provider.as_ref();
        // The latest clock reading of the scans: every lease runs from it.
        let now = candidates
            .iter()
            .map(|c| c.now)
            .chain(provider.map(|p| p.now))
            .max();
        let claiming = now.map(|now| Claiming {
            slots,
            policy: rules.policy.unwrap_or(default_policy),
            provider,
            now,
        });
        let mut allowance = provider.map_or_else(Allowance::unlimited, |p| p.allowance(queue));
        let mut held = Holds::default();
        // Declared before what borrows it (jobs found by a second scan).
        let mut extra: Vec<LockedJob> = Vec::new();
        let mut decided = match &claiming {
            Some(c) => decide(&candidates, c, &mut allowance, &mut held, &[]),
            None => Vec::new(),
        };
        // Sends paused and the slots not full: reconciles may wait behind
        // the held sends in run_at order; look for them.
        if held.count(Holdback::Paused) > 0 && room_left(&decided, slots) > 0 {
            let taken: std::collections::HashSet<u64> =
                candidates.iter().map(|c| c.job.id).collect();
            extra = scan(&mut tx, queue, wanted, true)
                .await?
                .ready
                .into_iter()
                .filter(|c| !taken.contains(&c.job.id))
                .collect();
        }
        if let Some(c) = &claiming {
            let more = decide(&extra, c, &mut allowance, &mut held, &decided);
            decided.extend(more);
        }

        let handed = decided.iter().filter(|d| d.slot.is_some()).count();
        let short = (handed as u32) < wanted;
        let budget_held = held.budget_total() > 0;
        let report = provider.map(|p| BudgetReport {
            provider: p.name.clone(),
            deferred: held.counts(),
            units_left: allowance.units.min(p.gcra().available()),
            in_flight: p.in_flight.map(|n| n + handed as u64),
        });
        let next_due = match (short && want_next_due, provider) {
            (false, _) => None,
            (true, Some(p)) if !held.is_empty() => held.due_in(p, allowance.spent),
            (true, _) => next_due(&mut tx, queue).await?,
        };
        let after = match provider {
            Some(p) => p.after_claim(queue, allowance.spent, budget_held)?,
            None => Vec::new(),
        };
        if decided.is_empty() {
            if after.is_empty() {
                tx.rollback().await?;
            } else {
                tx.commit_after(&after).await?;
            }
            return Ok(ClaimBatch {
                jobs: vec![Vec::new(); slots.len()],
                next_due,
                budget: report,
                parked: Vec::new(),
            });
        }
        let now = claiming
            .map(|c| c.now)
            .ok_or_else(|| CoordinatorError::Internal("a claim decided without a clock".into()))?;
        let events = write_decided(&mut tx, &decided, now).await?;
        let with_observations: Vec<u64> = decided
            .iter()
            .filter(|d| d.slot.is_some() && d.locked.has_observations)
            .map(|d| d.locked.job.id)
            .collect();
        let mut observations = reads::observations(&mut tx, &with_observations).await?;
        self.pause_in(PausePoint::ClaimBeforeCommit, &mut tx).await;
        events::append_and_commit_with(tx, &events, &after).await?;
        drop(events);
        let mut jobs: Vec<Vec<ClaimedJob>> = vec![Vec::new(); slots.len()];
        let mut parked = Vec::new();
        for d in decided {
            match d.slot {
                Some(i) => jobs[i].push(ClaimedJob {
                    takeover: d.locked.job.state == JobState::Running,
                    observations: observations.remove(&d.after.id).unwrap_or_default(),
                    job: d.after,
                    provider: provider.map(|p| p.name.clone()),
                }),
                None => parked.push(d.after),
            }
        }
        Ok(ClaimBatch {
            jobs,
            next_due,
            budget: report,
            parked,
        })
    }

    /// Takes over one named job: only a `running` job whose lease has
    /// expired by the DB clock. Refusals: `JobNotFound`, `JobFinished`
    /// (terminal state), `JobNotRunning` (ready or manual_review),
    /// `LeaseNotExpired`, and `QueueNotAllowed` when `scope` does not cover
    /// the job's queue (nothing written). When the job's queue dispatches
    /// to a provider, the takeover's reconcile spends its budget like any
    /// hand-out (docs/design.md rule 11): with too few units left, its sends
    /// paused entirely or its Retry-After running, `ProviderHoldback` with
    /// when to ask again, and nothing written.
    pub async fn takeover(
        &self,
        req: &TakeoverRequest,
        scope: &QueueScope,
    ) -> Result<ClaimedJob, CoordinatorError> {
        self.retry_conflicts(|| self.takeover_once(req, scope))
            .await
    }

    async fn takeover_once(
        &self,
        req: &TakeoverRequest,
        scope: &QueueScope,
    ) -> Result<ClaimedJob, CoordinatorError> {
        let mut tx = self.begin().await?;
        let locked = reads::lock_job(&mut tx, req.job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        let job = &locked.job;
        if let Some(refusal) = transition::takeover_refusal(job, locked.lease_expired, scope) {
            tx.rollback().await.map_err(convert_sqlx_err)?;
            return Err(refusal);
        }
        self.pause(PausePoint::TakeoverAfterLock).await;
        // The provider's row after the job's (see budget.rs: lock order).
        let rules_text = budget::rules_statements(&job.queue)?.join(";\n");
        let sets = batch::result_sets(&mut tx, &rules_text).await?;
        let rules = Rules::parse(&job.queue, &sets)?;
        let mut spend = Vec::new();
        if let Some(p) = &rules.provider {
            let cost = p.cost(NextAction::Reconcile);
            // A named takeover takes turns with no queue: it is one job an
            // operator or a worker asked for by name.
            let mut allowance = Allowance {
                units: p.gcra().available(),
                shared: false,
                ..p.allowance(&job.queue)
            };
            if let Err(why) = allowance.take(NextAction::Reconcile, cost) {
                tx.rollback().await.map_err(convert_sqlx_err)?;
                return Err(CoordinatorError::ProviderHoldback {
                    provider: p.name.clone(),
                    why,
                    retry_after: p.due_in(why, 0, cost),
                    throttled_until: p.throttled_until.filter(|_| why == Holdback::Throttled),
                });
            }
            spend = p.after_claim(&job.queue, allowance.spent, false)?;
        }
        // The row lock may have been waited for: stamp the lease from now.
        let now = batch::db_now(&mut tx).await?;
        let after = transition::hand_out(
            job,
            NextAction::Reconcile,
            false,
            req.lease,
            &req.worker_id,
            now,
        );
        let decided = [Decided {
            locked: &locked,
            after: after.clone(),
            slot: Some(0),
        }];
        let taken = write_decided(&mut tx, &decided, now).await?;
        events::append_all(&mut tx, &taken).await?;
        drop(taken);
        if !spend.is_empty() {
            batch::result_sets(&mut tx, &spend.join(";\n")).await?;
        }
        let mut observations = if locked.has_observations {
            reads::observations(&mut tx, &[job.id]).await?
        } else {
            Default::default()
        };
        self.pause_in(PausePoint::TakeoverBeforeCommit, &mut tx)
            .await;
        commit(tx).await?;
        Ok(ClaimedJob {
            observations: observations.remove(&after.id).unwrap_or_default(),
            job: after,
            takeover: true,
            provider: rules.provider.map(|p| p.name),
        })
    }
}

/// Due jobs a claim did not hand out, by why.
#[derive(Debug, Default)]
struct Holds {
    counts: BTreeMap<HoldKey, u32>,
    /// The smallest cost among the jobs held for units.
    min_cost: Option<u32>,
}

/// [`Holdback`] in a stable order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct HoldKey(u8);

const HOLDBACKS: [Holdback; 5] = [
    Holdback::Rate,
    Holdback::FairShare,
    Holdback::InFlight,
    Holdback::Throttled,
    Holdback::Paused,
];

impl Holds {
    fn add(&mut self, why: Holdback, cost: u32) {
        let k = HOLDBACKS.iter().position(|h| *h == why).unwrap_or(0) as u8;
        *self.counts.entry(HoldKey(k)).or_default() += 1;
        if matches!(why, Holdback::Rate | Holdback::FairShare) {
            self.min_cost = Some(self.min_cost.map_or(cost, |c| c.min(cost)));
        }
    }

    fn count(&self, why: Holdback) -> u32 {
        let k = HOLDBACKS.iter().position(|h| *h == why).unwrap_or(0) as u8;
        self.counts.get(&HoldKey(k)).copied().unwrap_or(0)
    }

    fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    fn counts(&self) -> Vec<(Holdback, u32)> {
        self.counts
            .iter()
            .map(|(k, n)| (HOLDBACKS[usize::from(k.0)], *n))
            .collect()
    }

    /// Held for the budget itself (rate, share, in-flight cap), not for an
    /// operator's pause or a throttle: what makes a queue wait its turn.
    fn budget_total(&self) -> u32 {
        [Holdback::Rate, Holdback::FairShare, Holdback::InFlight]
            .iter()
            .map(|h| self.count(*h))
            .sum()
    }

    /// When the first held job could go, as far as the provider row
    /// tells (`None`: a pause or the in-flight cap; the poll decides).
    fn due_in(&self, p: &LockedProvider, spent: u32) -> Option<Duration> {
        let mut due: Option<Duration> = None;
        for (why, _) in self.counts() {
            let cost = self.min_cost.unwrap_or(1);
            match p.due_in(why, spent, cost) {
                Some(d) => due = Some(due.map_or(d, |x| x.min(d))),
                None if why == Holdback::Paused
                    && p.pause == jobfence_domain::budget::Pause::All =>
                {
                    return None;
                }
                None => {}
            }
        }
        due
    }
}

/// Room left in the slots after `decided`.
fn room_left(decided: &[Decided<'_>], slots: &[ClaimSlot]) -> u32 {
    let handed = decided.iter().filter(|d| d.slot.is_some()).count() as u32;
    slots
        .iter()
        .map(|s| s.max_jobs)
        .sum::<u32>()
        .saturating_sub(handed)
}

/// The claim's facts: the slots, the policy, the provider and the clock
/// (every lease runs from `now`, the latest reading of the scans).
#[derive(Clone, Copy)]
struct Claiming<'s> {
    slots: &'s [ClaimSlot],
    policy: QueuePolicy,
    provider: Option<&'s LockedProvider>,
    now: DbTime,
}

/// Decides each candidate in scan order (after the decisions `before`):
/// parked (a resend past its window), handed to the next slot with room,
/// or held back by the provider's budget.
fn decide<'a>(
    candidates: &'a [LockedJob],
    claiming: &Claiming<'_>,
    allowance: &mut Allowance,
    held: &mut Holds,
    before: &[Decided<'_>],
) -> Vec<Decided<'a>> {
    let Claiming {
        slots,
        policy,
        provider,
        now,
    } = *claiming;
    let mut filled: Vec<u32> = vec![0; slots.len()];
    for d in before {
        if let Some(i) = d.slot {
            filled[i] += 1;
        }
    }
    let mut out = Vec::new();
    let mut slot = 0;
    for c in candidates {
        while slot < slots.len() && filled[slot] >= slots[slot].max_jobs {
            slot += 1;
        }
        let Some(s) = slots.get(slot) else { break };
        let takeover = c.job.state == JobState::Running;
        match claim_action(takeover, c.job.next_action, s.lease, c.dispatch, policy) {
            ClaimDecision::Park(reason) => out.push(Decided {
                locked: c,
                after: transition::park(&c.job, reason, now),
                slot: None,
            }),
            ClaimDecision::HandOut { action, dispatch } => {
                let cost = provider.map_or(0, |p| p.cost(action));
                match allowance.take(action, cost) {
                    Ok(()) => {
                        filled[slot] += 1;
                        out.push(Decided {
                            locked: c,
                            after: transition::hand_out(
                                &c.job,
                                action,
                                dispatch,
                                s.lease,
                                &s.worker_id,
                                now,
                            ),
                            slot: Some(slot),
                        });
                    }
                    Err(why) => held.add(why, cost),
                }
            }
        }
    }
    out
}

/// How long until the next job of `queue` becomes claimable (see
/// `queries/jobs/next_due.sql`).
async fn next_due(
    conn: &mut MySqlConnection,
    queue: &str,
) -> Result<Option<Duration>, CoordinatorError> {
    /// Anything further than this is "nothing pending" (the SQL's sentinel
    /// is the year 9999).
    const NOTHING: i64 = 100 * 365 * 24 * 3600 * 1_000_000;
    let row = sqlx::query(include_str!("queries/jobs/next_due.sql"))
        .bind(queue)
        .bind(queue)
        .fetch_one(conn)
        .await
        .map_err(convert_sqlx_err)?;
    let us: Option<i64> = super::rows::get(&row, "due_in_us")?;
    Ok(us
        .filter(|us| *us < NOTHING)
        .map(|us| Duration::from_micros(us.max(0) as u64)))
}

/// Writes what a claim decided (new attempts, fenced on the state and
/// attempt read under the lock; parked resends), and returns their events (`claimed`, `taken_over`,
/// `manual_review`), appended by the caller with its COMMIT.
async fn write_decided<'a>(
    conn: &mut MySqlConnection,
    decided: &'a [Decided<'_>],
    now: DbTime,
) -> Result<Vec<NewEvent<'a>>, CoordinatorError> {
    let changes: Vec<Change> = decided
        .iter()
        .map(|d| Change {
            before: &d.locked.job,
            after: &d.after,
        })
        .collect();
    for d in decided.iter().filter(|d| d.slot.is_some()) {
        transition::check_hand_out(&d.locked.job, &d.after)?;
    }
    batch::write_images(&mut *conn, &changes).await?;
    Ok(decided
        .iter()
        .map(|d| {
            let before = &d.locked.job;
            let after = &d.after;
            let (kind, to_state, detail) = match d.slot {
                None => (
                    EventKind::ManualReview,
                    JobState::ManualReview,
                    format!(
                        "hand_out:{}",
                        after.state_reason.as_deref().unwrap_or_default()
                    ),
                ),
                Some(_) if before.state == JobState::Running => (
                    EventKind::TakenOver,
                    JobState::Running,
                    after.next_action.as_str().to_owned(),
                ),
                Some(_) => (
                    EventKind::Claimed,
                    JobState::Running,
                    after.next_action.as_str().to_owned(),
                ),
            };
            NewEvent {
                job_id: after.id,
                queue: &after.queue,
                attempt: after.attempt,
                kind,
                from_state: Some(before.state),
                to_state: Some(to_state),
                current_attempt: after.attempt,
                request_digest: None,
                detail: Some(detail),
                created_at: now,
            }
        })
        .collect())
}
