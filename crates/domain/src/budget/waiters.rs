//! Waiters take turns at a provider's budget (docs/design.md rule 11,
//! "Waiters take turns"), as pure functions of what a claim read under the
//! provider's row lock.
//!
//! A long-polling Claim that the budget held back is written down as a
//! waiter of the provider (table `budget_waiters`), with the database
//! clock of that first look. From then on the units of the provider go to
//! its live waiters in that order, on every coordinator: a claim that
//! reads `n` jobs' worth of units available leaves one job's worth for
//! each of the first `n` waiters that are not its own, and only the rest
//! goes to the claim's other slots. So a waiter with `i` live waiters
//! registered before it is handed a job once `i + 1` jobs' worth of units
//! were spent or left for it, whatever claims that do not wait arrive
//! meanwhile, and on whichever coordinator they arrive.

use std::time::Duration;

/// Most live waiters of a provider a claim reads (in turn order); a waiter
/// further back counts this many ahead of it.
pub const MAX_WAITERS_READ: usize = 256;

/// The longest a waiter's registration lives without being refreshed, as a
/// number of the coordinator's poll intervals (its Claim looks again at
/// least once a poll interval): a crashed coordinator's waiters hold their
/// turn for at most this long.
pub const WAITER_TTL_POLLS: u32 = 3;

/// A waiting Claim's ticket, carried by each of its looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaiterTicket {
    /// Random, one per Claim call; the same for all of its looks.
    pub id: u64,
    /// How long its registration lives after this look unless refreshed:
    /// what is left of its wait, at most [`WAITER_TTL_POLLS`] poll
    /// intervals.
    pub ttl: Duration,
}

/// The turns of one claim transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turns {
    /// Units the claim may spend of those available: the available units
    /// less one job's worth for each waiter not its own that is owed one.
    pub units: u32,
    /// Waiters not the claim's own that are owed a unit now.
    pub left_for_others: u32,
}

/// The turns of a claim whose slots carry the waiters `mine`, given the
/// provider's live waiters in turn order (`live`), the units `available`
/// and the cost of one job's worth (`job_cost`, at least 1).
///
/// The first `available / job_cost` waiters of `live` are owed a job's
/// worth each; those not among `mine` have it left for them.
pub fn turns(live: &[u64], mine: &[u64], available: u32, job_cost: u32) -> Turns {
    let jobs = (available / job_cost.max(1)) as usize;
    let others = live.iter().take(jobs).filter(|w| !mine.contains(w)).count() as u32;
    Turns {
        units: available.saturating_sub(others.saturating_mul(job_cost.max(1))),
        left_for_others: others,
    }
}

/// How many live waiters come before `waiter` in turn order: its place, or
/// all of them when it is not registered yet (it is written at the back).
pub fn ahead_of(live: &[u64], waiter: u64) -> usize {
    live.iter().position(|w| *w == waiter).unwrap_or(live.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_waiters_a_claim_takes_every_unit() {
        let t = turns(&[], &[], 5, 1);
        assert_eq!(
            t,
            Turns {
                units: 5,
                left_for_others: 0
            }
        );
    }

    #[test]
    fn a_unit_owed_to_another_coordinators_waiter_is_left_for_it() {
        // One unit, one waiter elsewhere: nothing for this claim.
        assert_eq!(turns(&[7], &[], 1, 1).units, 0);
        // Three units, one waiter elsewhere: two for this claim.
        assert_eq!(turns(&[7], &[], 3, 1).units, 2);
        // The waiter's own claim takes it.
        assert_eq!(turns(&[7], &[7], 1, 1).units, 1);
    }

    #[test]
    fn units_go_in_turn_order() {
        // Two units, waiters 1, 2, 3: 1 and 2 are owed; 3 waits.
        assert_eq!(turns(&[1, 2, 3], &[3], 2, 1).units, 0);
        assert_eq!(turns(&[1, 2, 3], &[2], 2, 1).units, 1);
        assert_eq!(turns(&[1, 2, 3], &[1, 2], 2, 1).units, 2);
        // A job costs 2 units: four units are two jobs' worth.
        let t = turns(&[1, 2, 3], &[], 4, 2);
        assert_eq!(
            t,
            Turns {
                units: 0,
                left_for_others: 2
            }
        );
        assert_eq!(turns(&[1, 2, 3], &[], 5, 2).units, 1);
    }

    #[test]
    fn a_waiters_place_counts_those_before_it() {
        assert_eq!(ahead_of(&[4, 5, 6], 4), 0);
        assert_eq!(ahead_of(&[4, 5, 6], 6), 2);
        assert_eq!(ahead_of(&[4, 5, 6], 9), 3);
    }
}
