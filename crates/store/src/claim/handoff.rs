//! A fenced write that claims its caller's next jobs in the same
//! transaction (docs/design.md rule 16): Complete or Fail, then Claim, one
//! COMMIT and one fsync per job for a worker taking one job at a time.
//!
//! The two halves are decided independently. The write is fenced exactly
//! as on its own (`writeback`): a stale write is refused and logged, and
//! its caller still gets its next jobs. The claim half is exactly a Claim
//! of the named queue (`claim`): expired leases first, the provider's
//! budget spent in the same COMMIT, a paused queue handing out nothing,
//! and a refused or empty claim leaving the write applied. What binds them
//! is the COMMIT: when its outcome is unknown, it is unknown for both, and
//! the caller acts on no job the claim would have handed out (rule 4). A
//! replay of a write applied before hands out nothing: whatever its first
//! call claimed stays leased to the caller until the lease ends, then is
//! taken over with reconcile.

use super::scan::{lock_and_scan, Reads};
use super::write::{decided_changes, decided_events};
use super::{hand_out, ClaimPhase, ClaimRows, Prescan};
use crate::batch::Change;
use crate::events::NewEvent;
use crate::pause::PausePoint;
use crate::reads;
use crate::run::{batch_transaction, Body};
use crate::tx::Tx;
use crate::writeback::{Prelocked, WriteResult};
use crate::JobStore;
use crate::{batch, events};
use jobfence_domain::budget::BudgetReport;
use jobfence_domain::{
    ClaimSlot, ClaimedJob, CoordinatorError, FencedWrite, Job, JobState, Observation,
    QueuePolicies, QueuePolicy, ScopedWrite,
};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// One call's answer in a write-and-claim transaction that committed.
#[derive(Debug)]
pub struct Handoff {
    /// The write's own answer: applied, a replay, or its refusal
    /// (`AttemptSuperseded`, `JobNotRunning`, …: nothing of the job
    /// written).
    pub write: WriteResult,
    /// The jobs claimed for the caller, at most its slot's `max_jobs`;
    /// none after a replay.
    pub jobs: Vec<ClaimedJob>,
    /// When the caller got fewer jobs than it asked for and asked when to
    /// look again: as for a Claim.
    pub next_due: Option<Duration>,
}

/// The answers of a batch of write-and-claim calls of one queue, in the
/// order of the calls, and what the claims did against the provider's
/// budget and parked (for metrics and logs).
#[derive(Debug, Default)]
pub struct HandoffBatch {
    /// `Err` is for both halves of the call: `CommitOutcomeUnknown` (act on
    /// nothing it would have handed out), `DatabaseUnavailable`,
    /// `TransactionConflict` after 3 tries.
    pub answers: Vec<Result<Handoff, CoordinatorError>>,
    pub budgets: Vec<BudgetReport>,
    pub parked: Vec<Job>,
}

/// What every round of a batch shares.
struct Calls<'c> {
    queue: &'c str,
    policy: QueuePolicy,
    writes: &'c [ScopedWrite],
    slots: &'c [ClaimSlot],
    policies: &'c QueuePolicies,
    want_next_due: bool,
}

/// One committed round: the answers of its calls, in round order.
struct RoundDone {
    answers: Vec<Handoff>,
    budget: Option<BudgetReport>,
    parked: Vec<Job>,
}

impl JobStore {
    /// Applies each write of `writes` and claims its caller's next jobs of
    /// `queue` into `slots[i]`, the calls to distinct jobs in one
    /// transaction (a group commit, as for writes on their own; calls to
    /// the same job one after the other, in order). `policy` is the
    /// coordinator's default for the queue; `policies` decide Fail's
    /// resends. Deadlocks and lock wait timeouts roll the transaction back
    /// and run it again (up to 3 times, counted).
    pub async fn write_and_claim(
        &self,
        queue: &str,
        policy: QueuePolicy,
        writes: &[ScopedWrite],
        slots: &[ClaimSlot],
        policies: &QueuePolicies,
        want_next_due: bool,
    ) -> HandoffBatch {
        let calls = Calls {
            queue,
            policy,
            writes,
            slots,
            policies,
            want_next_due,
        };
        let mut answers: Vec<Option<Result<Handoff, CoordinatorError>>> =
            (0..writes.len()).map(|_| None).collect();
        let mut out = HandoffBatch::default();
        let mut rest: Vec<usize> = (0..writes.len()).collect();
        while !rest.is_empty() {
            let mut jobs = HashSet::new();
            let (round, later): (Vec<usize>, Vec<usize>) = rest
                .iter()
                .partition(|&&i| jobs.insert(writes[i].write.job_id()));
            match batch_transaction!(self, |tx| self.handoff_round(tx, &calls, &round)) {
                Ok(done) => {
                    for (&i, answer) in round.iter().zip(done.answers) {
                        answers[i] = Some(Ok(answer));
                    }
                    out.budgets.extend(done.budget);
                    out.parked.extend(done.parked);
                }
                Err(e) => {
                    for &i in &round {
                        answers[i] = Some(Err(e.clone()));
                    }
                }
            }
            rest = later;
        }
        out.answers = answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(CoordinatorError::Unanswered { what: "write" })))
            .collect();
        out
    }

    /// One transaction: the writes of `round` (fenced, their images
    /// written), then one claim for the callers whose write is not a
    /// replay, then every event and the budget's statements with the
    /// COMMIT.
    async fn handoff_round(
        &self,
        tx: &mut Tx,
        calls: &Calls<'_>,
        round: &[usize],
    ) -> Body<RoundDone> {
        let (prelocked, prescan) = self.lock_and_prescan(tx, calls, round).await?;
        let open = self
            .open_round(tx, calls.writes, round, calls.policies, prelocked)
            .await?;
        // The written jobs' images go with the hand-outs', in one UPDATE;
        // until then the expired-lease scan must not see them as running.
        let written = open.locked_ids();
        // A Fail that reports the provider's Retry-After holds its
        // hand-outs from now: the claim half must see the hold.
        if !open.throttles.is_empty() {
            batch::result_sets(tx, &open.throttles.join(";\n")).await?;
        }
        // A replay hands out nothing (see the module docs), nor a write
        // refused for its job's queue: that refusal is the whole call's.
        let claiming: Vec<usize> = (0..round.len())
            .filter(|&k| !open.is_replay(k) && !open.is_forbidden(k))
            .collect();
        let slots: Vec<ClaimSlot> = claiming
            .iter()
            .map(|&k| calls.slots[round[k]].clone())
            .collect();
        let mut changes = open.changes();
        // The jobs the writes take out of `running` no longer count under
        // the provider's in-flight cap.
        let finishing: Vec<&Job> = changes
            .iter()
            .filter(|c| c.after.state != JobState::Running)
            .map(|c| c.before)
            .collect();
        let mut rows = ClaimRows::default();
        let phase = self
            .claim_half_phase(
                tx,
                &mut rows,
                calls,
                &slots,
                (&written, prescan, &finishing),
            )
            .await?;
        drop(finishing);
        let mut new_events = open.events();
        let (claim_events, observations) = claim_half(tx, phase.as_ref(), &mut changes).await?;
        batch::write_images(tx, &changes).await?;
        drop(changes);
        new_events.extend(claim_events);
        let after: Vec<String> = phase
            .as_ref()
            .map(|p| p.spend.after.clone())
            .unwrap_or_default();
        self.pause_in(PausePoint::HandoffBeforeCommit, tx).await;
        if new_events.is_empty() && after.is_empty() {
            tx.rollback().await?;
        } else {
            // Any error, an unknown outcome included, is both halves'.
            events::append_and_commit_with(tx, &new_events, &after).await?;
        }
        drop(new_events);
        let claimed = phase.map(|p| claimed(p, observations, slots.len()));
        let (jobs, next_due, budget, parked) =
            claimed.unwrap_or_else(|| (Vec::new(), None, None, Vec::new()));
        Ok(RoundDone {
            answers: answers(open.answers(None), &claiming, jobs, next_due),
            budget,
            parked,
        })
    }
}

/// Each call's answer of a committed round, in round order: its write's
/// `writes[k]`, and the jobs of its slot when it claimed (`claiming`: the
/// calls that claimed, in the order of the slots of `jobs`).
fn answers(
    writes: Vec<WriteResult>,
    claiming: &[usize],
    mut jobs: Vec<Vec<ClaimedJob>>,
    next_due: Option<Duration>,
) -> Vec<Handoff> {
    writes
        .into_iter()
        .enumerate()
        .map(|(k, write)| {
            let slot = claiming.iter().position(|&c| c == k);
            Handoff {
                write,
                jobs: slot
                    .and_then(|s| jobs.get_mut(s).map(std::mem::take))
                    .unwrap_or_default(),
                next_due: slot.and(next_due),
            }
        })
        .collect()
}

impl JobStore {
    /// A round of one call (a lone worker's usual call): the written
    /// job's lock and the claim's reads in one round trip (see
    /// [`lock_and_scan`]), before the write is decided. Other rounds lock,
    /// decide, then scan, as apart. If the write turns out a replay, which
    /// hands out nothing, the rows the scan locked are released with the
    /// transaction.
    async fn lock_and_prescan(
        &self,
        tx: &mut Tx,
        calls: &Calls<'_>,
        round: &[usize],
    ) -> Result<(Option<Prelocked>, Prescan), CoordinatorError> {
        let &[only] = round else {
            return Ok((None, Prescan::No));
        };
        // A Fail that reports a Retry-After holds its provider's row before
        // the claim scans (it may wait for it): the hand-outs' leases must
        // start after that wait, so it scans after, as apart.
        let throttles = matches!(
            &calls.writes[only].write,
            FencedWrite::Fail(f) if f.provider_retry_after.is_some()
        );
        if throttles {
            return Ok((None, Prescan::No));
        }
        let started = Instant::now();
        let job_id = calls.writes[only].write.job_id();
        let reads = Reads::for_queue(self, calls.queue);
        let max_jobs = calls.slots[only].max_jobs;
        let (locked, scan) = lock_and_scan(self, tx, job_id, calls.queue, max_jobs, reads).await?;
        Ok((Some((locked, started)), Prescan::Sent(scan.map(Box::new))))
    }

    /// The claim half's decisions (see [`JobStore::claim_phase`]), when
    /// any caller of the round wants a job; `written`: the round's own
    /// jobs, left out of the expired-lease scan; `prescan`: the claim's
    /// scan, when [`JobStore::lock_and_prescan`] sent it; `finishing`: the
    /// round's jobs its writes take out of `running`.
    async fn claim_half_phase<'a>(
        &self,
        tx: &mut Tx,
        rows: &'a mut ClaimRows,
        calls: &Calls<'a>,
        slots: &'a [ClaimSlot],
        (written, prescan, finishing): (&[u64], Prescan, &[&Job]),
    ) -> Result<Option<ClaimPhase<'a>>, CoordinatorError> {
        if slots.is_empty() {
            return Ok(None);
        }
        let phase = self
            .claim_phase(
                tx,
                rows,
                calls.queue,
                calls.policy,
                slots,
                calls.want_next_due,
                (written, prescan, finishing),
            )
            .await?;
        Ok(Some(phase))
    }
}

/// What the claim half decided (new attempts, parked resends): their new
/// images added to `changes` (written with the write half's, in one
/// UPDATE), their events to append with the COMMIT, and the observations
/// of the jobs it hands out, by job.
async fn claim_half<'p>(
    tx: &mut Tx,
    phase: Option<&'p ClaimPhase<'_>>,
    changes: &mut Vec<Change<'p>>,
) -> Result<(Vec<NewEvent<'p>>, HashMap<u64, Vec<Observation>>), CoordinatorError> {
    let Some(phase) = phase.filter(|p| !p.decided.is_empty()) else {
        return Ok((Vec::new(), HashMap::new()));
    };
    let now = phase.clock()?;
    changes.extend(decided_changes(&phase.decided)?);
    let new_events = decided_events(&phase.decided, now);
    let with_observations: Vec<u64> = phase
        .decided
        .iter()
        .filter(|d| d.slot.is_some() && d.locked.has_observations)
        .map(|d| d.locked.job.id)
        .collect();
    Ok((
        new_events,
        reads::observations(tx, &with_observations).await?,
    ))
}

/// What a committed claim half handed out, per slot, and what it says
/// about the budget.
type Claimed = (
    Vec<Vec<ClaimedJob>>,
    Option<Duration>,
    Option<BudgetReport>,
    Vec<Job>,
);

fn claimed(
    phase: ClaimPhase<'_>,
    observations: HashMap<u64, Vec<Observation>>,
    slots: usize,
) -> Claimed {
    let ClaimPhase {
        decided,
        spend,
        provider,
        ..
    } = phase;
    let (jobs, parked) = hand_out(decided, observations, slots, provider);
    (jobs, spend.next_due, spend.report, parked)
}
