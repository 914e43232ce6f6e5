//! The decisions of one claim transaction, made on the rows its scans
//! locked: each candidate is handed to the next slot with room, parked (a
//! resend past its window, docs/design.md rule 6), or held back by its
//! provider's budget (rules 11 and 12), with the count of what was held
//! and why.

use crate::budget::LockedProvider;
use crate::reads::LockedJob;
use jobfence_domain::budget::{Allowance, Holdback};
use jobfence_domain::policy::{claim_action, ClaimDecision};
use jobfence_domain::{transition, ClaimSlot, DbTime, Job, JobState, QueuePolicy};
use std::collections::BTreeMap;
use std::time::Duration;

/// A job a claim decided on: handed to slot `slot`, or parked.
pub(super) struct Decided<'a> {
    pub(super) locked: &'a LockedJob,
    pub(super) after: Job,
    /// `None`: parked in manual review, not handed out.
    pub(super) slot: Option<usize>,
}

/// Due jobs a claim did not hand out, by why.
#[derive(Debug, Default)]
pub(super) struct Holds {
    counts: BTreeMap<HoldKey, u32>,
    /// The smallest cost among the jobs held for units.
    min_cost: Option<u32>,
}

/// [`Holdback`] in a stable order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct HoldKey(u8);

const HOLDBACKS: [Holdback; 6] = [
    Holdback::Rate,
    Holdback::FairShare,
    Holdback::InFlight,
    Holdback::Throttled,
    Holdback::Paused,
    Holdback::KeyCap,
];

impl Holds {
    pub(super) fn add(&mut self, why: Holdback, cost: u32) {
        let k = HOLDBACKS.iter().position(|h| *h == why).unwrap_or(0) as u8;
        *self.counts.entry(HoldKey(k)).or_default() += 1;
        if matches!(why, Holdback::Rate | Holdback::FairShare) {
            self.min_cost = Some(self.min_cost.map_or(cost, |c| c.min(cost)));
        }
    }

    pub(super) fn count(&self, why: Holdback) -> u32 {
        let k = HOLDBACKS.iter().position(|h| *h == why).unwrap_or(0) as u8;
        self.counts.get(&HoldKey(k)).copied().unwrap_or(0)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    pub(super) fn counts(&self) -> Vec<(Holdback, u32)> {
        self.counts
            .iter()
            .map(|(k, n)| (HOLDBACKS[usize::from(k.0)], *n))
            .collect()
    }

    /// Held for the budget itself (rate, share, in-flight cap), not for an
    /// operator's pause or a throttle: what makes a queue wait its turn.
    pub(super) fn budget_total(&self) -> u32 {
        [Holdback::Rate, Holdback::FairShare, Holdback::InFlight]
            .iter()
            .map(|h| self.count(*h))
            .sum()
    }

    /// When the first held job could go, as far as the provider row
    /// tells (`None`: a pause or the in-flight cap; the poll decides).
    pub(super) fn due_in(&self, p: &LockedProvider, spent: u32) -> Option<Duration> {
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
pub(super) fn room_left(decided: &[Decided<'_>], slots: &[ClaimSlot]) -> u32 {
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
pub(super) struct Claiming<'s> {
    pub(super) slots: &'s [ClaimSlot],
    pub(super) policy: QueuePolicy,
    pub(super) provider: Option<&'s LockedProvider>,
    pub(super) now: DbTime,
}

/// Decides each candidate in scan order (after the decisions `before`):
/// parked (a resend past its window), handed to the next slot with room,
/// or held back by the provider's budget.
pub(super) fn decide<'a>(
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
                let key = c.job.fairness_key.as_deref().unwrap_or("");
                match allowance.take_for(key, action, cost) {
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
