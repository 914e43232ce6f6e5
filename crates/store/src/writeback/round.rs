//! The one write round: every fenced write (RenewLease, Complete, Fail;
//! lone or a group commit; with or without a claim half, docs/design.md
//! rule 16) is applied by [`JobStore::write_calls`], one transaction per
//! round of calls to distinct jobs.
//!
//! A round locks its rows by primary key (in id order), decides each call
//! on its own locked row (the fence, [`JobStore::open_round`]), and, when
//! the calls carry a claim half, runs one Claim of the half's queue for
//! the callers whose write is not a replay (`claim/handoff.rs`); then it
//! writes every new image in one UPDATE and appends every event with the
//! COMMIT. Calls with no claim half keep the plain round's statements,
//! transaction shape and lock order: the claim steps are skipped, and a
//! provider's Retry-After is held with the COMMIT rather than before the
//! claim.

use super::super::claim::handoff::{answers, claimed, Handoff, HandoffBatch};
use super::super::claim::{ClaimRows, Prescan};
use super::{OpenRound, WriteResult};
use crate::events;
use crate::pause::PausePoint;
use crate::run::{batch_transaction, Body};
use crate::tx::Tx;
use crate::{batch, JobStore};
use jobfence_domain::budget::BudgetReport;
use jobfence_domain::{
    ClaimSlot, CoordinatorError, Job, JobState, QueuePolicies, QueuePolicy, ScopedWrite,
};
use std::collections::HashSet;

/// The claim half of a batch's calls (docs/design.md rule 16): call `i`
/// claims its caller's next jobs of `queue` into `slots[i]`, in the
/// transaction of its write.
#[derive(Debug, Clone, Copy)]
pub struct ClaimHalf<'c> {
    /// The queue every call of the batch claims from.
    pub queue: &'c str,
    /// The coordinator's default policy for `queue`.
    pub policy: QueuePolicy,
    /// One slot per write, in the order of the writes.
    pub slots: &'c [ClaimSlot],
    /// Whether a caller that gets fewer jobs than it asked for wants to
    /// know when to look again.
    pub want_next_due: bool,
}

/// What every round of a batch shares.
pub(crate) struct Calls<'c> {
    pub writes: &'c [ScopedWrite],
    pub policies: &'c QueuePolicies,
    pub claim: Option<ClaimHalf<'c>>,
}

/// One committed round: the answers of its calls, in round order.
pub(crate) struct RoundDone {
    pub answers: Vec<Handoff>,
    pub budget: Option<BudgetReport>,
    pub parked: Vec<Job>,
}

impl JobStore {
    /// Applies `writes` and answers each one, in order: the calls to
    /// distinct jobs in one transaction (a group commit); calls to the
    /// same job (a retry racing its original, a renewal racing a
    /// Complete) one after the other, each in the next transaction, so
    /// the later one sees what the earlier one did. With `claim`, each
    /// call also claims its caller's next jobs (rule 16). A call whose
    /// caller's scope does not cover its job's queue (read under the row
    /// lock) is refused `QueueNotAllowed` and writes nothing, not even a
    /// refusal event. A deadlock or lock wait timeout rolls a round back
    /// and it is run again (up to 3 times, counted; then
    /// `TransactionConflict` for each of its calls); `policies` decide
    /// the resends of Fail.
    pub async fn write_calls(
        &self,
        writes: &[ScopedWrite],
        claim: Option<ClaimHalf<'_>>,
        policies: &QueuePolicies,
    ) -> HandoffBatch {
        let calls = Calls {
            writes,
            policies,
            claim,
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
            match batch_transaction!(self, |tx| self.round(tx, &calls, &round)) {
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

    /// [`write_calls`](Self::write_calls) with no claim half: each call's
    /// write answer, in order.
    pub async fn write_scoped_batch(
        &self,
        writes: &[ScopedWrite],
        policies: &QueuePolicies,
    ) -> Vec<WriteResult> {
        self.write_calls(writes, None, policies)
            .await
            .answers
            .into_iter()
            .map(|a| a.and_then(|h| h.write))
            .collect()
    }

    /// One transaction over the calls of `round` (indexes of
    /// `calls.writes`, to distinct jobs): the writes fenced, the claim
    /// half when the calls carry one, every new image in one UPDATE,
    /// every event and the budget's statements with the COMMIT. `Err` is
    /// for the whole round. Without a claim half, a COMMIT whose outcome
    /// is unknown is each applied call's answer; with one it is the whole
    /// round's, both halves' (rule 4).
    async fn round(&self, tx: &mut Tx, calls: &Calls<'_>, round: &[usize]) -> Body<RoundDone> {
        let (prelocked, prescan) = match &calls.claim {
            Some(half) => self.lock_and_prescan(tx, half, calls.writes, round).await?,
            None => (None, Prescan::No),
        };
        let open = self
            .open_round(tx, calls.writes, round, calls.policies, prelocked)
            .await?;
        let mut changes = open.changes();
        let mut rows = ClaimRows::default();
        let (claiming, slots) = claimers(calls, &open, round);
        let phase = match &calls.claim {
            Some(half) => {
                self.claim_half_phase(tx, &mut rows, half, &slots, &open, &changes, prescan)
                    .await?
            }
            None => None,
        };
        let mut new_events = open.events();
        let (claim_events, observations) =
            super::super::claim::handoff::claim_half(tx, phase.as_ref(), &mut changes).await?;
        batch::write_images(tx, &changes).await?;
        // Retried jobs go to the back of their lines (rule 18).
        crate::fairness::back_in_line(tx, &crate::fairness::requeued(&changes)).await?;
        drop(changes);
        new_events.extend(claim_events);
        // Without a claim half, a Fail's Retry-After holds its provider
        // with the COMMIT; with one, it was held before the claim.
        let after: Vec<String> = match (&phase, &calls.claim) {
            (Some(p), _) => p.spend.after.clone(),
            (None, Some(_)) => Vec::new(),
            (None, None) => open.throttles.clone(),
        };
        let point = match calls.claim {
            Some(_) => PausePoint::HandoffBeforeCommit,
            None => PausePoint::WriteBeforeCommit,
        };
        self.pause_in(point, tx).await;
        let commit_error = if new_events.is_empty() && after.is_empty() {
            // Replays, unknown jobs and forbidden calls write nothing.
            tx.rollback().await?;
            None
        } else {
            match events::append_and_commit_with(tx, &new_events, &after).await {
                Ok(()) => None,
                // Answered call by call: the failed COMMIT closed the
                // connection, so the runner commits nothing more.
                Err(e @ CoordinatorError::CommitOutcomeUnknown(_))
                    if calls.claim.is_none() && !tx.is_open() =>
                {
                    Some(e)
                }
                // A conflict, refused before COMMIT ran (nothing applied),
                // or an unknown outcome of both halves.
                Err(e) => return Err(e.into()),
            }
        };
        drop(new_events);
        let claimed = phase.map(|p| claimed(p, observations, slots.len()));
        let (jobs, next_due, budget, parked) =
            claimed.unwrap_or_else(|| (Vec::new(), None, None, Vec::new()));
        Ok(RoundDone {
            answers: answers(
                open.answers(commit_error.as_ref()),
                &claiming,
                jobs,
                next_due,
            ),
            budget,
            parked,
        })
    }
}

/// The calls of a round that claim (in round order) and their slots: with
/// a claim half, those whose write is not a replay (which hands out
/// nothing), nor refused for its job's queue (that refusal is the whole
/// call's); none without one.
fn claimers(
    calls: &Calls<'_>,
    open: &OpenRound<'_>,
    round: &[usize],
) -> (Vec<usize>, Vec<ClaimSlot>) {
    let Some(half) = &calls.claim else {
        return (Vec::new(), Vec::new());
    };
    let claiming: Vec<usize> = (0..round.len())
        .filter(|&k| !open.is_replay(k) && !open.is_forbidden(k))
        .collect();
    let slots = claiming
        .iter()
        .map(|&k| half.slots[round[k]].clone())
        .collect();
    (claiming, slots)
}

/// The jobs a round's writes take out of `running`: no longer in flight
/// under the provider's cap for the claim half.
pub(crate) fn finishing<'a>(changes: &[batch::Change<'a>]) -> Vec<&'a Job> {
    changes
        .iter()
        .filter(|c| c.after.state != JobState::Running)
        .map(|c| c.before)
        .collect()
}
