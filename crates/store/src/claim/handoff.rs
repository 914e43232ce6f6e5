//! The claim half of a write round (docs/design.md rule 16): a Complete
//! or Fail that claims its caller's next jobs in the same transaction,
//! one COMMIT and one fsync per job for a worker taking one job at a time.
//! The round itself is `writeback/round.rs`; this is what it runs when its
//! calls carry a claim half.
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
use crate::batch::{self, Change};
use crate::events::NewEvent;
use crate::reads;
use crate::tx::Tx;
use crate::writeback::round::{finishing, ClaimHalf};
use crate::writeback::{OpenRound, Prelocked, WriteResult};
use crate::JobStore;
use jobfence_domain::budget::BudgetReport;
use jobfence_domain::{
    ClaimSlot, ClaimedJob, CoordinatorError, FencedWrite, Job, Observation, ScopedWrite,
};
use std::collections::HashMap;
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

/// Each call's answer of a committed round, in round order: its write's
/// `writes[k]`, and the jobs of its slot when it claimed (`claiming`: the
/// calls that claimed, in the order of the slots of `jobs`).
pub(crate) fn answers(
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
    pub(crate) async fn lock_and_prescan(
        &self,
        tx: &mut Tx,
        half: &ClaimHalf<'_>,
        writes: &[ScopedWrite],
        round: &[usize],
    ) -> Result<(Option<Prelocked>, Prescan), CoordinatorError> {
        let &[only] = round else {
            return Ok((None, Prescan::No));
        };
        // A Fail that reports a Retry-After holds its provider's row before
        // the claim scans (it may wait for it): the hand-outs' leases must
        // start after that wait, so it scans after, as apart.
        let throttles = matches!(
            &writes[only].write,
            FencedWrite::Fail(f) if f.provider_retry_after.is_some()
        );
        if throttles {
            return Ok((None, Prescan::No));
        }
        let started = Instant::now();
        let job_id = writes[only].write.job_id();
        let reads = Reads::for_queue(self, half.queue);
        let max_jobs = self.scan_limit(half.queue, half.slots[only].max_jobs);
        let (locked, scan) = lock_and_scan(self, tx, job_id, half.queue, max_jobs, reads).await?;
        Ok((Some((locked, started)), Prescan::Sent(scan.map(Box::new))))
    }

    /// The claim half's decisions (see [`JobStore::claim_phase`]), when
    /// any caller of the round wants a job (`slots`: theirs). First holds
    /// the providers a Fail of the round reported a Retry-After for (the
    /// claim must see the hold). The round's own jobs (`open`) are left
    /// out of the expired-lease scan: their images are written with the
    /// hand-outs', in one UPDATE, and until then they still read as
    /// running; those its writes take out of `running` (`changes`) no
    /// longer count under the provider's in-flight cap. `prescan`: the
    /// claim's scan, when [`JobStore::lock_and_prescan`] sent it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim_half_phase<'a>(
        &self,
        tx: &mut Tx,
        rows: &'a mut ClaimRows,
        half: &ClaimHalf<'a>,
        slots: &'a [ClaimSlot],
        open: &OpenRound<'_>,
        changes: &[Change<'_>],
        prescan: Prescan,
    ) -> Result<Option<ClaimPhase<'a>>, CoordinatorError> {
        if !open.throttles.is_empty() {
            batch::result_sets(tx, &open.throttles.join(";\n")).await?;
        }
        if slots.is_empty() {
            return Ok(None);
        }
        let written = open.locked_ids();
        let finishing = finishing(changes);
        let phase = self
            .claim_phase(
                tx,
                rows,
                half.queue,
                half.policy,
                slots,
                half.want_next_due,
                (&written, prescan, &finishing),
            )
            .await?;
        Ok(Some(phase))
    }
}

/// What the claim half decided (new attempts, parked resends): their new
/// images added to `changes` (written with the write half's, in one
/// UPDATE), their events to append with the COMMIT, and the observations
/// of the jobs it hands out, by job.
pub(crate) async fn claim_half<'p>(
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

pub(crate) fn claimed(
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
