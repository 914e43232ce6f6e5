//! The recent trend of each queue, behind the Queues page's sparklines.
//!
//! QueueStats is a snapshot; a trend needs the past. It is rebuilt from
//! the stored events at every refresh ([`Coordinator::state_changes`]:
//! the state changes of the last [`WINDOW`] in 5-second buckets): walking
//! back from the counts of now, each bucket's changes are undone. So the
//! trend is the same on every coordinator, starts full when the page is
//! opened, and survives a restart. Jobs pruned within the window (their
//! events go with them) leave the finished rate; their enqueue and finish
//! cancel out in the backlog.
//!
//! [`Coordinator::state_changes`]: jobfence_core::Coordinator::state_changes

use jobfence_domain::admin::QueueStats;
use jobfence_domain::admin::{StateChange, TREND_BUCKET as BUCKET};
use jobfence_domain::JobState;

use std::time::Duration;

/// How far back the trends reach.
pub const WINDOW: Duration = Duration::from_secs(600);

/// One queue at one time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// Jobs `ready` or `running`.
    pub backlog: i64,
    /// Jobs in `manual_review`.
    pub parked: i64,
}

impl Point {
    fn of(stats: &QueueStats) -> Point {
        let mut p = Point::default();
        for (state, n) in &stats.counts {
            let n = i64::try_from(*n).unwrap_or(i64::MAX);
            match state {
                JobState::Ready | JobState::Running => p.backlog += n,
                JobState::ManualReview => p.parked += n,
                _ => {}
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
    /// Jobs finished per minute, per bucket.
    pub finished_per_min: Vec<(f64, f64)>,
}

fn backlog(s: Option<JobState>) -> bool {
    matches!(s, Some(JobState::Ready | JobState::Running))
}

fn parked(s: Option<JobState>) -> bool {
    s == Some(JobState::ManualReview)
}

fn finished(s: Option<JobState>) -> bool {
    matches!(
        s,
        Some(JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    )
}

/// +1 for a change into `set`, -1 for one out of it, 0 otherwise.
fn delta(c: &StateChange, set: fn(Option<JobState>) -> bool) -> i64 {
    let n = i64::try_from(c.jobs).unwrap_or(i64::MAX);
    n * (i64::from(set(c.to)) - i64::from(set(c.from)))
}

/// The trend of `stats`'s queue over [`WINDOW`], from `changes` (every
/// queue's; see the module documentation).
pub fn series(stats: &QueueStats, changes: &[StateChange]) -> Series {
    let buckets = (WINDOW.as_secs() / BUCKET.as_secs()) as usize;
    let mut per_bucket = vec![(0i64, 0i64, 0i64); buckets];
    for c in changes.iter().filter(|c| c.queue == stats.queue) {
        if let Some(b) = per_bucket.get_mut(c.bucket as usize) {
            b.0 += delta(c, backlog);
            b.1 += delta(c, parked);
            b.2 += delta(c, finished).max(0);
        }
    }
    let step = BUCKET.as_secs_f64();
    let per_min = 60.0 / step;
    let mut now = Point::of(stats);
    let mut s = Series::default();
    s.backlog.push((0.0, now.backlog as f64));
    s.parked.push((0.0, now.parked as f64));
    for (b, (d_backlog, d_parked, done)) in per_bucket.into_iter().enumerate() {
        let ago = step * b as f64;
        s.finished_per_min.push((ago, done as f64 * per_min));
        now.backlog = (now.backlog - d_backlog).max(0);
        now.parked = (now.parked - d_parked).max(0);
        s.backlog.push((ago + step, now.backlog as f64));
        s.parked.push((ago + step, now.parked as f64));
    }
    s.backlog.reverse();
    s.parked.reverse();
    s.finished_per_min.reverse();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(ready: u64, parked: u64) -> QueueStats {
        QueueStats {
            queue: "refunds".into(),
            counts: vec![(JobState::Ready, ready), (JobState::ManualReview, parked)],
            ..Default::default()
        }
    }

    fn change(bucket: u32, from: Option<JobState>, to: JobState, jobs: u64) -> StateChange {
        StateChange {
            queue: "refunds".into(),
            bucket,
            from,
            to: Some(to),
            jobs,
        }
    }

    #[test]
    fn the_past_is_now_with_each_buckets_changes_undone() {
        use JobState::*;
        let changes = [
            // 10 enqueued 12 s ago (bucket 2), 4 of them finished 3 s ago
            // (bucket 0), one parked 7 s ago (bucket 1).
            change(2, None, Ready, 10),
            change(0, Some(Running), Succeeded, 4),
            change(1, Some(Running), ManualReview, 1),
            StateChange {
                queue: "other".into(),
                ..change(0, None, Ready, 99)
            },
        ];
        let s = series(&stats(5, 1), &changes);
        let at = |v: &[(f64, f64)], ago: f64| v.iter().find(|p| p.0 == ago).unwrap().1;
        assert_eq!(at(&s.backlog, 0.0), 5.0);
        assert_eq!(at(&s.backlog, 5.0), 9.0, "before the 4 finished");
        assert_eq!(at(&s.backlog, 10.0), 10.0, "before one was parked");
        assert_eq!(at(&s.backlog, 15.0), 0.0, "before the 10 arrived");
        assert_eq!(at(&s.parked, 5.0), 1.0);
        assert_eq!(at(&s.parked, 10.0), 0.0);
        assert_eq!(at(&s.finished_per_min, 0.0), 48.0, "4 in 5 s");
        assert_eq!(at(&s.finished_per_min, 5.0), 0.0);
        assert_eq!(s.backlog.len(), 121);
        assert!(
            s.backlog.windows(2).all(|w| w[0].0 > w[1].0),
            "oldest first"
        );
    }
}
