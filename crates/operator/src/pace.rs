//! `--max-rate`: a command that sends its work in batches (a settlement
//! import's lines, a bulk repair's jobs) sends no more than so many units
//! a second, so that the database time it takes leaves the workers theirs.

use std::time::{Duration, Instant};

/// Units a second; 0 for no limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace(pub u32);

impl Pace {
    /// How long to wait before sending more, once `sent` units went out
    /// since `started`: `None` when the rate allows more now (or there is
    /// no limit).
    pub(crate) fn ahead(self, sent: u64, started: Instant) -> Option<Duration> {
        if self.0 == 0 {
            return None;
        }
        let due = Duration::from_secs_f64(sent as f64 / f64::from(self.0));
        due.checked_sub(started.elapsed()).filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_waits_only_when_ahead_of_its_rate() {
        let now = Instant::now();
        assert_eq!(Pace(0).ahead(1_000_000, now), None, "no limit");
        let wait = Pace(1000)
            .ahead(500, now)
            .expect("500 at 1000/s are due in 0.5 s");
        assert!(wait > Duration::from_millis(400) && wait <= Duration::from_millis(500));
        let long_ago = now - Duration::from_secs(2);
        assert_eq!(Pace(1000).ahead(500, long_ago), None, "behind the rate");
    }
}
