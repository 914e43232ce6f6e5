//! The recent trend of each queue, behind the Queues page's sparklines.
//!
//! QueueStats is a snapshot; a trend needs several. The console keeps the
//! snapshots its own Queues page already fetched (at most one per
//! [`MIN_SPACING`], the last [`KEEP`] of them) in memory: no background
//! work while nobody looks, no new table. The price: the trend starts when
//! someone opens the page, is per replica, and is lost on restart, which
//! the page says.

use jobfence_domain::admin::QueueStats;
use jobfence_domain::JobState;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Shortest time between two kept snapshots.
pub const MIN_SPACING: Duration = Duration::from_secs(5);
/// Snapshots kept (at [`MIN_SPACING`]: 10 minutes).
pub const KEEP: usize = 120;

/// One queue in one snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// Jobs `ready` or `running`.
    pub backlog: u64,
    /// Jobs in `manual_review`.
    pub parked: u64,
    /// Jobs `succeeded`, `failed` or `cancelled` (ever).
    pub finished: u64,
}

impl Point {
    fn of(stats: &QueueStats) -> Point {
        let mut p = Point::default();
        for (state, n) in &stats.counts {
            match state {
                JobState::Ready | JobState::Running => p.backlog += n,
                JobState::ManualReview => p.parked += n,
                _ => p.finished += n,
            }
        }
        p
    }
}

/// The trend of one queue: `(seconds before now, value)`, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Ready and running jobs.
    pub backlog: Vec<(f64, f64)>,
    /// Parked jobs.
    pub parked: Vec<(f64, f64)>,
    /// Jobs finished per minute between two snapshots.
    pub finished_per_min: Vec<(f64, f64)>,
}

/// Kept snapshots.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<(Instant, BTreeMap<String, Point>)>,
}

impl History {
    /// Keeps `stats` as the snapshot at `now`, unless the last one is
    /// younger than [`MIN_SPACING`].
    pub fn record(&mut self, now: Instant, stats: &[QueueStats]) {
        if let Some((last, _)) = self.samples.back() {
            if now.saturating_duration_since(*last) < MIN_SPACING {
                return;
            }
        }
        let points = stats
            .iter()
            .map(|s| (s.queue.clone(), Point::of(s)))
            .collect();
        self.samples.push_back((now, points));
        while self.samples.len() > KEEP {
            self.samples.pop_front();
        }
    }

    /// The trend of `queue` as seen at `now`.
    pub fn series(&self, queue: &str, now: Instant) -> Series {
        let mut s = Series::default();
        let mut prev: Option<(Instant, Point)> = None;
        for (at, points) in &self.samples {
            let Some(p) = points.get(queue) else {
                prev = None;
                continue;
            };
            let ago = now.saturating_duration_since(*at).as_secs_f64();
            s.backlog.push((ago, p.backlog as f64));
            s.parked.push((ago, p.parked as f64));
            if let Some((t0, p0)) = prev {
                let minutes = at.saturating_duration_since(t0).as_secs_f64() / 60.0;
                if minutes > 0.0 {
                    let done = p.finished.saturating_sub(p0.finished) as f64;
                    s.finished_per_min.push((ago, done / minutes));
                }
            }
            prev = Some((*at, *p));
        }
        s
    }

    /// How far back the kept snapshots reach at `now`.
    pub fn span(&self, now: Instant) -> Duration {
        self.samples
            .front()
            .map_or(Duration::ZERO, |(at, _)| now.saturating_duration_since(*at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(ready: u64, parked: u64, done: u64) -> Vec<QueueStats> {
        vec![QueueStats {
            queue: "refunds".into(),
            counts: vec![
                (JobState::Ready, ready),
                (JobState::Succeeded, done),
                (JobState::ManualReview, parked),
            ],
            ..Default::default()
        }]
    }

    #[test]
    fn snapshots_are_spaced_and_give_a_rate() {
        let t0 = Instant::now();
        let mut h = History::default();
        h.record(t0, &stats(10, 0, 0));
        h.record(t0 + Duration::from_secs(1), &stats(99, 99, 99));
        h.record(t0 + Duration::from_secs(30), &stats(4, 1, 60));
        let now = t0 + Duration::from_secs(30);
        let s = h.series("refunds", now);
        assert_eq!(s.backlog, [(30.0, 10.0), (0.0, 4.0)]);
        assert_eq!(s.parked, [(30.0, 0.0), (0.0, 1.0)]);
        assert_eq!(s.finished_per_min, [(0.0, 120.0)]);
        assert_eq!(h.span(now), Duration::from_secs(30));
        assert_eq!(h.series("other", now), Series::default());
    }

    #[test]
    fn only_the_last_snapshots_are_kept() {
        let t0 = Instant::now();
        let mut h = History::default();
        for i in 0..(KEEP as u64 + 10) {
            h.record(t0 + MIN_SPACING * i as u32, &stats(i, 0, 0));
        }
        let now = t0 + MIN_SPACING * (KEEP as u32 + 9);
        let s = h.series("refunds", now);
        assert_eq!(s.backlog.len(), KEEP);
        assert_eq!(s.backlog[0].1, 10.0);
    }
}
