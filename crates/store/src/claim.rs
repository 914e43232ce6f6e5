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

mod decide;
mod key_caps;
mod scan;
mod spend;
use scan::{scan, scan_reconciles, Reads, Scan};
use spend::BudgetSpend;
pub mod handoff;
mod write;

use super::batch::{self, with_job_columns};
use super::budget::{self, LockedProvider, Rules};
use super::events;
use super::literal;
use super::pause::PausePoint;
use super::reads::{self, LockedJob};
use super::run::{batch_transaction, transaction, Body, Failure};
use super::tx::Tx;

use super::JobStore;
use decide::{decide, room_left, Claiming, Decided, Holds};
use jobfence_domain::budget::{Allowance, BudgetReport, Holdback};
use jobfence_domain::{
    transition, ClaimSlot, ClaimedJob, CoordinatorError, DbTime, Job, NextAction, Observation,
    QueuePolicy, QueueScope, Takeover,
};
use sqlx::MySqlConnection;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use write::{hand_out, write_decided};

/// A claim's scan when its transaction sent it already (a handoff's
/// first round trip, with its write's lock: see
/// [`JobStore::write_calls`]).
pub(crate) enum Prescan {
    /// Not sent: the claim sends its own.
    No,
    /// Sent: its scan, or `None` when it read only the queue's row and the
    /// row named a provider (the claim then scans with the provider's
    /// reads).
    Sent(Option<Box<Scan>>),
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
pub struct ClaimBatchOutcome {
    pub jobs: Vec<Vec<ClaimedJob>>,
    pub next_due: Option<Duration>,
    /// What the claim did against its provider's budget, when the queue
    /// dispatches to one.
    pub budget: Option<BudgetReport>,
    /// Due resends parked in manual review instead of being handed out
    /// (their window would close within the lease; docs/design.md rule 6).
    pub parked: Vec<Job>,
}

impl JobStore {
    /// How many rows a claim of `queue` that wants `wanted` jobs scans:
    /// more when its provider had caps per fairness key at the store's
    /// last claim of it ([`key_caps::scan_limit`]).
    pub(crate) fn scan_limit(&self, queue: &str, wanted: u32) -> u32 {
        let capped = self
            .provider_queues
            .get(queue)
            .is_some_and(|s| s.key_capped);
        key_caps::scan_limit(wanted, capped)
    }

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
    ) -> Result<ClaimBatchOutcome, CoordinatorError> {
        batch_transaction!(self, |tx| {
            self.claim_in(tx, queue, policy, slots, want_next_due)
        })
    }

    async fn claim_in(
        &self,
        tx: &mut Tx,
        queue: &str,
        default_policy: QueuePolicy,
        slots: &[ClaimSlot],
        want_next_due: bool,
    ) -> Body<ClaimBatchOutcome> {
        let mut rows = ClaimRows::default();
        let phase = self
            .claim_phase(
                tx,
                &mut rows,
                queue,
                default_policy,
                slots,
                want_next_due,
                (&[], Prescan::No, &[]),
            )
            .await?;
        if phase.decided.is_empty() {
            // Nothing handed out (an operator may have paused the queue:
            // then nothing to spend either, and only a resume changes it).
            if phase.spend.after.is_empty() {
                tx.rollback().await?;
            } else {
                tx.commit_after(&phase.spend.after).await?;
            }
            return Ok(ClaimBatchOutcome {
                jobs: vec![Vec::new(); slots.len()],
                next_due: phase.spend.next_due,
                budget: phase.spend.report,
                parked: Vec::new(),
            });
        }
        let now = phase.clock()?;
        let observations = self
            .write_claim(tx, &phase.decided, now, &phase.spend.after)
            .await?;
        let (jobs, parked) = hand_out(phase.decided, observations, slots.len(), phase.provider);
        Ok(ClaimBatchOutcome {
            jobs,
            next_due: phase.spend.next_due,
            budget: phase.spend.report,
            parked,
        })
    }

    /// The deciding half of a claim transaction, in `tx`: the scans (the
    /// queue's rules, its provider's row locked, the candidate rows locked
    /// with SKIP LOCKED), the decisions and what they spend of the budget,
    /// nothing written yet. `rows` keeps what the decisions borrow. A
    /// paused queue decides nothing and spends nothing. `exclude`: jobs the
    /// transaction writes itself, left out of the expired-lease scan;
    /// `prescan`: the scan, when sent already; `finishing`: the jobs the
    /// transaction takes out of `running` (a handoff's applied writes, as
    /// they were locked), no longer in flight under the provider's cap.
    #[allow(clippy::too_many_arguments)]
    async fn claim_phase<'a>(
        &self,
        tx: &mut Tx,
        rows: &'a mut ClaimRows,
        queue: &'a str,
        default_policy: QueuePolicy,
        slots: &'a [ClaimSlot],
        want_next_due: bool,
        (exclude, prescan, finishing): (&[u64], Prescan, &[&Job]),
    ) -> Result<ClaimPhase<'a>, CoordinatorError> {
        let wanted: u32 = slots.iter().map(|s| s.max_jobs).sum();
        let mut scanned = self
            .scan_rules_and_jobs(tx, queue, wanted, exclude, prescan)
            .await?;
        if let Some(p) = scanned.rules.provider.as_mut() {
            p.not_in_flight(finishing);
            p.load_waiters(tx).await?;
        }
        let ClaimRows {
            rules,
            candidates,
            extra,
        } = rows;
        let rules: &'a Rules = rules.insert(scanned.rules);
        if rules.queue_paused {
            return Ok(ClaimPhase {
                decided: Vec::new(),
                spend: BudgetSpend::default(),
                now: None,
                provider: None,
            });
        }
        *candidates = scanned.expired;
        // Delayed jobs come due: at the back of their lines (rule 18),
        // and handed out after the others when there is room.
        let unplaced: Vec<(&Job, bool)> = scanned.unplaced.iter().map(|c| (&c.job, true)).collect();
        crate::fairness::back_in_line(tx, &unplaced).await?;
        drop(unplaced);
        // Caps per key: every row scanned (more than wanted), so a capped
        // key's jobs leave room for the next keys'.
        let room = match rules
            .provider
            .as_ref()
            .is_some_and(|p| p.budget.per_key.any())
        {
            true => usize::MAX,
            false => (wanted as usize).saturating_sub(candidates.len()),
        };
        candidates.extend(scanned.ready.into_iter().chain(scanned.unplaced).take(room));
        self.pause(PausePoint::ClaimAfterScan).await;
        let mut run = ClaimRun::new(queue, slots, want_next_due, rules, default_policy);
        run.finishing = key_caps::finishing(finishing);
        let candidates: &'a Vec<LockedJob> = candidates;
        run.clock(candidates);
        let decided = run.decide(tx, candidates, extra).await?;
        let spend = run.spend_budget(tx, &decided).await?;
        Ok(ClaimPhase {
            decided,
            spend,
            now: run.now,
            provider: run.provider,
        })
    }

    /// The claim's scans ([`scan`]), with the reads the store's last claim
    /// of the queue called for ([`Reads::for_queue`]), or with the
    /// provider's when the queue's row named one after all. A scan the
    /// caller sent already (`prescan`) is not sent again. What the scan
    /// found is kept for the queue's next claim.
    async fn scan_rules_and_jobs(
        &self,
        tx: &mut Tx,
        queue: &str,
        wanted: u32,
        exclude: &[u64],
        prescan: Prescan,
    ) -> Result<Scan, CoordinatorError> {
        let wanted = self.scan_limit(queue, wanted);
        let first = match prescan {
            Prescan::Sent(Some(scanned)) => Some(*scanned),
            Prescan::Sent(None) => None,
            Prescan::No => {
                scan(
                    self,
                    tx,
                    queue,
                    wanted,
                    Reads::for_queue(self, queue),
                    exclude,
                )
                .await?
            }
        };
        let scanned = match first {
            Some(scanned) => scanned,
            None => {
                let reads = Reads::Provider { in_flight: false };
                scan(self, tx, queue, wanted, reads, exclude)
                    .await?
                    .ok_or_else(|| {
                        CoordinatorError::Internal("a provider's claim scan gave no rules".into())
                    })?
            }
        };
        self.provider_queues.set(
            queue,
            scanned
                .rules
                .provider
                .as_ref()
                .map(|p| budget::ProviderSeen {
                    capped: p.budget.max_in_flight.is_some(),
                    key_capped: p.budget.per_key.any(),
                }),
        );
        Ok(scanned)
    }

    /// Writes what a claim decided and its events, reads the observations
    /// of the jobs it hands out, and commits with the statements that
    /// spend its provider's budget (`after`): one transaction, so a claim
    /// that does not commit spends nothing.
    async fn write_claim(
        &self,
        tx: &mut Tx,
        decided: &[Decided<'_>],
        now: DbTime,
        after: &[String],
    ) -> Result<HashMap<u64, Vec<Observation>>, CoordinatorError> {
        let events = write_decided(tx, decided, now).await?;
        let with_observations: Vec<u64> = decided
            .iter()
            .filter(|d| d.slot.is_some() && d.locked.has_observations)
            .map(|d| d.locked.job.id)
            .collect();
        let observations = reads::observations(tx, &with_observations).await?;
        self.pause_in(PausePoint::ClaimBeforeCommit, tx).await;
        events::append_and_commit_with(tx, &events, after).await?;
        Ok(observations)
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
        req: &Takeover,
        scope: &QueueScope,
    ) -> Result<ClaimedJob, CoordinatorError> {
        transaction!(self, |tx| self.takeover_in(tx, req, scope))
    }

    async fn takeover_in(
        &self,
        tx: &mut MySqlConnection,
        req: &Takeover,
        scope: &QueueScope,
    ) -> Body<ClaimedJob> {
        let locked = reads::lock_job(tx, req.job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        let job = &locked.job;
        if let Some(refusal) = transition::takeover_refusal(job, locked.lease_expired, scope) {
            return Err(refusal.into());
        }
        self.pause(PausePoint::TakeoverAfterLock).await;
        // The provider's row after the job's (see budget.rs: lock order).
        let rules_text = budget::rules_statements(&job.queue, true)?.join(";\n");
        let mut sets = batch::result_sets(tx, &rules_text).await?;
        let own = sets.pop().unwrap_or_default();
        let (rules, _) = Rules::parse_or_own_row(&job.queue, &sets, &own)?;
        let mut spend = Vec::new();
        if let Some(p) = &rules.provider {
            let cost = p.cost(NextAction::Reconcile);
            // A named takeover takes turns with no queue: it is one job an
            // operator or a worker asked for by name.
            let mut allowance = Allowance {
                units: p.gcra().available(),
                shared: false,
                ..p.allowance(&job.queue, &[])
            };
            if let Err(why) = allowance.take(NextAction::Reconcile, cost) {
                return Err(Failure::Error(CoordinatorError::ProviderHoldback {
                    provider: p.name.clone(),
                    why,
                    retry_after: p.due_in(why, 0, cost),
                    throttled_until: p.throttled_until.filter(|_| why == Holdback::Throttled),
                }));
            }
            spend = p.after_claim(&job.queue, allowance.spent, false)?;
        }
        // The row lock may have been waited for: stamp the lease from now.
        let now = batch::db_now(tx).await?;
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
        let taken = write_decided(tx, &decided, now).await?;
        events::append_all(tx, &taken).await?;
        drop(taken);
        if !spend.is_empty() {
            batch::result_sets(tx, &spend.join(";\n")).await?;
        }
        let mut observations = if locked.has_observations {
            reads::observations(tx, &[job.id]).await?
        } else {
            Default::default()
        };
        self.pause_in(PausePoint::TakeoverBeforeCommit, tx).await;
        Ok(ClaimedJob {
            observations: observations.remove(&after.id).unwrap_or_default(),
            job: after,
            takeover: true,
            provider: rules.provider.map(|p| p.name),
        })
    }
}

/// What a claim transaction owns while it decides: the queue's stored
/// rules and the rows its scans locked, which the decisions borrow.
#[derive(Default)]
pub(crate) struct ClaimRows {
    rules: Option<Rules>,
    candidates: Vec<LockedJob>,
    /// Reconciles found by a second scan behind a provider's paused sends.
    extra: Vec<LockedJob>,
}

/// A claim decided in its transaction and not yet written: the jobs it
/// hands out or parks, what it spends of the budget, the clock its leases
/// run from (`None` when the scans read no row), and the provider.
pub(crate) struct ClaimPhase<'a> {
    decided: Vec<Decided<'a>>,
    pub(crate) spend: BudgetSpend,
    now: Option<DbTime>,
    provider: Option<&'a LockedProvider>,
}

impl ClaimPhase<'_> {
    /// The clock every lease of the claim runs from.
    fn clock(&self) -> Result<DbTime, CoordinatorError> {
        self.now
            .ok_or_else(|| CoordinatorError::Internal("a claim decided without a clock".into()))
    }
}

/// One claim transaction's facts and budget as it decides: the slots,
/// the queue's policy, its provider's row (locked by the scan), the clock
/// every lease runs from, what the budget still allows and what it held
/// back.
struct ClaimRun<'s> {
    queue: &'s str,
    slots: &'s [ClaimSlot],
    wanted: u32,
    want_next_due: bool,
    policy: QueuePolicy,
    provider: Option<&'s LockedProvider>,
    /// The latest clock reading of the scans; `None` before
    /// [`clock`](Self::clock), or when they read no row at all.
    now: Option<DbTime>,
    allowance: Allowance,
    held: Holds,
    /// Jobs of each fairness key the transaction takes out of `running`
    /// (a handoff's writes), not in flight under the caps per key.
    finishing: HashMap<String, u64>,
}

impl<'s> ClaimRun<'s> {
    fn new(
        queue: &'s str,
        slots: &'s [ClaimSlot],
        want_next_due: bool,
        rules: &'s Rules,
        default_policy: QueuePolicy,
    ) -> Self {
        let provider = rules.provider.as_ref();
        ClaimRun {
            queue,
            slots,
            wanted: slots.iter().map(|s| s.max_jobs).sum(),
            want_next_due,
            policy: rules.policy.unwrap_or(default_policy),
            provider,
            now: None,
            allowance: provider.map_or_else(Allowance::unlimited, |p| {
                let mine: Vec<u64> = slots
                    .iter()
                    .filter_map(|s| s.waiter)
                    .map(|t| t.id)
                    .collect();
                p.allowance(queue, &mine)
            }),
            held: Holds::default(),
            finishing: HashMap::new(),
        }
    }

    /// Takes the latest clock reading of the scans (the candidates' and
    /// the provider row's): every lease runs from it.
    fn clock(&mut self, candidates: &[LockedJob]) {
        self.now = candidates
            .iter()
            .map(|c| c.now)
            .chain(self.provider.map(|p| p.now))
            .max();
    }

    /// Decides the candidates in scan order and, when the provider's sends
    /// are paused and the slots are not full, the reconciles waiting behind
    /// the held sends in run_at order, found by a second scan into `extra`.
    async fn decide<'a>(
        &mut self,
        tx: &mut Tx,
        candidates: &'a [LockedJob],
        extra: &'a mut Vec<LockedJob>,
    ) -> Result<Vec<Decided<'a>>, CoordinatorError> {
        let Some(now) = self.now else {
            return Ok(Vec::new());
        };
        let claiming = Claiming {
            slots: self.slots,
            policy: self.policy,
            provider: self.provider,
            now,
        };
        if let Some(p) = self.provider.filter(|p| p.budget.per_key.any()) {
            let keys = key_caps::allowance(tx, p, candidates, &self.finishing).await?;
            self.allowance.per_key = Some(keys);
        }
        let (allowance, held) = (&mut self.allowance, &mut self.held);
        let mut decided = decide(candidates, &claiming, allowance, held, &[]);
        if held.count(Holdback::Paused) > 0 && room_left(&decided, self.slots) > 0 {
            let taken: HashSet<u64> = candidates.iter().map(|c| c.job.id).collect();
            *extra = scan_reconciles(tx, self.queue, self.wanted)
                .await?
                .into_iter()
                .filter(|c| !taken.contains(&c.job.id))
                .collect();
        }
        let extra: &'a Vec<LockedJob> = extra;
        let more = decide(extra, &claiming, allowance, held, &decided);
        decided.extend(more);
        Ok(decided)
    }
}
