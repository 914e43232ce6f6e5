//! Fair hand-out (docs/design.md rule 18): a job's priority and fairness
//! key, and the order claims read a queue in.
//!
//! Claims take due ready jobs in their *start round* order (start-time
//! fair queuing, with one job as the unit of work): the n-th pending job
//! of a (queue, fairness key, priority) starts one round after the
//! (n-1)-th, and a key with nothing pending starts at the queue's
//! frontier, the highest round handed out so far. Within one priority
//! the claims so go round-robin across the keys with due jobs. A
//! priority `p` moves its jobs [`ROUNDS_PER_STEP`] rounds per step
//! ahead of (above [`Priority::DEFAULT`]) or behind (below it) where
//! they would start: an urgent job goes next, and a low one still leaves
//! once the frontier reaches its round, so no priority starves.

use crate::validate::Violations;

mod caps;
pub use caps::{KeyAllowance, KeyCaps, KeyState};

/// Longest fairness key, in bytes.
pub const MAX_FAIRNESS_KEY_BYTES: usize = 128;

/// The place of a ready job not due yet (a delayed Enqueue, a retry after
/// a delay): below every round, out of the claim scan's range, so claims
/// never read past it. A claim places it when it comes due, at the back
/// of its line (store `claim/scan.rs`, `fairness.rs`), so a merchant's
/// scheduled batch does not jump every line when it comes due.
pub const UNPLACED: i64 = -(1 << 62);

/// How many rounds one step of priority moves a job.
pub const ROUNDS_PER_STEP: i64 = 100;

/// A job's priority: 1 (lowest) to 9 (most urgent), 5 when not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(u8);

impl Priority {
    /// The lowest priority.
    pub const MIN: Priority = Priority(1);
    /// The most urgent priority.
    pub const MAX: Priority = Priority(9);
    /// A job's priority when its Enqueue names none.
    pub const DEFAULT: Priority = Priority(5);

    /// `p` when it is in range.
    pub fn new(p: u32) -> Option<Priority> {
        (u32::from(Self::MIN.0)..=u32::from(Self::MAX.0))
            .contains(&p)
            .then_some(Priority(p as u8))
    }

    /// A stored priority (the column is checked on the way in; a value
    /// out of range, written by hand, reads as the nearest bound).
    pub fn stored(p: u8) -> Priority {
        Priority(p.clamp(Self::MIN.0, Self::MAX.0))
    }

    /// The priority field of a request: `0` is not given (the default);
    /// anything outside 1..=9 is refused into `v`, naming `field`.
    pub fn field(v: &mut Violations, field: &str, p: u32) -> Priority {
        if p == 0 {
            return Self::DEFAULT;
        }
        Self::new(p).unwrap_or_else(|| {
            v.add(
                field,
                format!("must be 1 (lowest) to 9 (most urgent), or 0 for the default 5 (got {p})"),
            );
            Self::DEFAULT
        })
    }

    /// The number, 1..=9.
    pub fn get(self) -> u8 {
        self.0
    }

    /// How many rounds this priority moves a job ahead (negative: back)
    /// of where the default priority would start it.
    pub fn head_start(self) -> i64 {
        (i64::from(self.0) - i64::from(Self::DEFAULT.0)) * ROUNDS_PER_STEP
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The start rounds of `n` jobs joining the line of one (fairness key,
/// priority) whose last start round was `last` (`None`: never one),
/// when the queue's frontier (its highest round handed out) is
/// `frontier`: one round after the last, or the frontier when that is
/// later (a key with nothing pending neither loses its place nor jumps
/// ahead of those already waiting), one more for each next job. The
/// order claims read is the start round less the priority's
/// [`head_start`](Priority::head_start); Enqueue computes the same in SQL
/// (store `queries/enqueue/insert.sql`).
pub fn start_rounds(last: Option<i64>, frontier: i64, n: usize) -> impl Iterator<Item = i64> {
    let first = last.unwrap_or(0).max(frontier - 1) + 1;
    (0..n as i64).map(move |k| first + k)
}

/// The fairness key field of a request: `""` is not given; a blank key is
/// refused, as is one over [`MAX_FAIRNESS_KEY_BYTES`].
pub fn key_field(v: &mut Violations, field: &str, key: String) -> Option<String> {
    let key = v.optional(field, key)?;
    if key.len() > MAX_FAIRNESS_KEY_BYTES {
        v.add(
            field,
            format!(
                "must be at most {MAX_FAIRNESS_KEY_BYTES} bytes (got {})",
                key.len()
            ),
        );
        return None;
    }
    Some(key)
}

/// The most jobs a job of a (fairness key, priority) with `ahead` jobs of
/// its own before it can wait behind, when `streams` (fairness key,
/// priority) pairs have due jobs and every other stream's jobs are at
/// this job's priority: one per stream per round, for its own rounds and
/// the rounds its priority puts it back (`head_start` below the
/// default). This is the bound docs/design.md rule 18 states.
pub fn wait_bound(ahead: u64, priority: Priority, streams: u64) -> u64 {
    let back = (-priority.head_start()).max(0) as u64;
    (ahead + 1 + back) * streams
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_zero_is_the_default_and_out_of_range_is_refused() {
        let mut v = Violations::default();
        assert_eq!(Priority::field(&mut v, "priority", 0), Priority::DEFAULT);
        assert_eq!(Priority::field(&mut v, "priority", 9).get(), 9);
        assert!(v.0.is_empty());
        Priority::field(&mut v, "items[2].priority", 10);
        assert_eq!(v.0.len(), 1);
        assert_eq!(v.0[0].field, "items[2].priority");
    }

    #[test]
    fn head_start_moves_urgent_ahead_and_low_back() {
        assert_eq!(Priority::DEFAULT.head_start(), 0);
        assert_eq!(Priority::MAX.head_start(), 4 * ROUNDS_PER_STEP);
        assert_eq!(Priority::MIN.head_start(), -4 * ROUNDS_PER_STEP);
    }

    #[test]
    fn keys_empty_blank_and_long() {
        let mut v = Violations::default();
        assert_eq!(key_field(&mut v, "fairness_key", String::new()), None);
        assert_eq!(
            key_field(&mut v, "fairness_key", "m-1".into()).as_deref(),
            Some("m-1")
        );
        assert!(v.0.is_empty());
        assert_eq!(key_field(&mut v, "fairness_key", "  ".into()), None);
        assert_eq!(key_field(&mut v, "fairness_key", "é".repeat(65)), None);
        assert_eq!(v.0.len(), 2);
    }

    #[test]
    fn a_line_starts_after_its_last_round_or_at_the_frontier() {
        assert_eq!(start_rounds(None, 0, 3).collect::<Vec<_>>(), [1, 2, 3]);
        // Pending jobs ahead of the frontier: after them.
        assert_eq!(start_rounds(Some(90), 50, 2).collect::<Vec<_>>(), [91, 92]);
        // Nothing pending (the last round is behind): at the frontier.
        assert_eq!(start_rounds(Some(10), 50, 2).collect::<Vec<_>>(), [50, 51]);
    }

    #[test]
    fn the_bound_counts_one_job_per_stream_per_round() {
        // The 20th job of a key (19 ahead), 11 keys due: 220 jobs.
        assert_eq!(wait_bound(19, Priority::DEFAULT, 11), 220);
        // A lowest-priority job waits 400 more rounds.
        assert_eq!(wait_bound(0, Priority::MIN, 2), 802);
    }
}
