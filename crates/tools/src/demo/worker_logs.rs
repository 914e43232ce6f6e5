//! Calls that failed at the workers, read back from their logs: a worker
//! logs a warning for each call that still failed after its own retries
//! (a claim, a write back, a release). Counting those that fall inside a
//! fault's time window tells what the fault cost the workers.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// What a worker's warning says when a call to the coordinator failed
/// after the client's retries (Rust SDK, refund worker, Python worker).
const FAILURE_MARKERS: &[&str] = &[
    "claim failed",
    "write back failed",
    "could not release",
    "could not record",
];

/// What a worker's warning says of a claim whose commit's outcome was
/// unknown (docs/design.md rule 4): not retried, the worker holds nothing,
/// and whatever the claim took comes back after its lease, reconciled.
/// Counted apart from the failures: it is the designed answer to a cut
/// connection, not a call the retries failed to carry through.
const UNCLEAR_MARKERS: &[&str] = &["claim outcome unknown"];

/// The time at the start of a log line: RFC 3339 (the Rust workers'
/// `tracing` format, Node's `toISOString`, the Go refund worker's) or `YYYY-MM-DD HH:MM:SS,mmm`
/// in UTC (the Python refund worker's).
fn line_time(line: &str) -> Option<SystemTime> {
    let first = line.split_whitespace().next()?;
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(first) {
        return Some(t.into());
    }
    let head = line.get(..23)?;
    let t = chrono::NaiveDateTime::parse_from_str(head, "%Y-%m-%d %H:%M:%S,%3f").ok()?;
    Some(t.and_utc().into())
}

/// How long after a fault ends its failures are still its own: a call
/// that started during the fault may fail a little after it.
pub const GRACE: Duration = Duration::from_secs(1);

/// A worker frozen (SIGSTOP) from `from` until it was resumed at `to`
/// (`None`: never resumed). A frozen worker cannot retry, and its calls'
/// deadlines pass while it sleeps: its failures then, and just after it
/// wakes, are the freeze's cost, whatever else happened meanwhile.
#[derive(Debug, Clone)]
pub struct Frozen {
    /// The worker's name, its log file's stem (`rust-1` for `rust-1.log`).
    pub worker: String,
    pub from: SystemTime,
    pub to: Option<SystemTime>,
}

impl Frozen {
    /// `worker`, frozen from now on.
    pub fn from_now(worker: &str) -> Self {
        Frozen {
            worker: worker.to_owned(),
            from: SystemTime::now(),
            to: None,
        }
    }

    /// The latest of `frozen` resumed now.
    pub fn resumed_now(frozen: &mut [Frozen]) {
        if let Some(f) = frozen.last_mut() {
            f.to = Some(SystemTime::now());
        }
    }

    fn covers(&self, worker: &str, t: SystemTime, grace: Duration) -> bool {
        self.worker == worker && t >= self.from && self.to.is_none_or(|to| t <= to + grace)
    }
}

/// The times of the lines with one of `markers` logged by each worker in
/// `logs` (the workers' log files), by worker name.
fn marked_times(logs: &Path, markers: &[&str]) -> Vec<(String, Vec<SystemTime>)> {
    let Ok(dir) = std::fs::read_dir(logs) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(worker) = name.strip_suffix(".log") else {
            continue;
        };
        let is_worker = ["rust-", "python-", "node-", "go-"]
            .iter()
            .any(|p| worker.starts_with(p));
        if !is_worker {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let times = text
            .lines()
            .filter(|l| markers.iter().any(|m| l.contains(m)))
            .filter_map(line_time)
            .collect();
        out.push((worker.to_owned(), times));
    }
    out
}

/// Failed worker calls logged in `logs` within `window` (inclusive) or
/// up to `grace` after it, leaving out those of a worker that was frozen
/// then (see [`Frozen`]).
pub fn failures_between(
    logs: &Path,
    window: (SystemTime, SystemTime),
    grace: Duration,
    frozen: &[Frozen],
) -> usize {
    marked_between(logs, FAILURE_MARKERS, window, grace, frozen)
}

/// Claims left unclear (see [`UNCLEAR_MARKERS`]), counted as
/// [`failures_between`] counts failures.
pub fn unclear_claims_between(
    logs: &Path,
    window: (SystemTime, SystemTime),
    grace: Duration,
    frozen: &[Frozen],
) -> usize {
    marked_between(logs, UNCLEAR_MARKERS, window, grace, frozen)
}

fn marked_between(
    logs: &Path,
    markers: &[&str],
    (from, to): (SystemTime, SystemTime),
    grace: Duration,
    frozen: &[Frozen],
) -> usize {
    let until = to + grace;
    marked_times(logs, markers)
        .iter()
        .flat_map(|(worker, times)| times.iter().map(move |t| (worker, *t)))
        .filter(|(_, t)| *t >= from && *t <= until)
        .filter(|(worker, t)| !frozen.iter().any(|f| f.covers(worker, *t, grace)))
        .count()
}

/// `line` with, when it tells that a frozen worker was resumed, the calls
/// that worker saw fail while frozen or just after it woke (its own cost,
/// left out of every other fault's count).
pub fn with_frozen_cost(line: String, logs: &Path, frozen: &[Frozen]) -> String {
    let Some(f) = frozen
        .iter()
        .rev()
        .find(|f| f.to.is_some() && line.starts_with(&format!("{} resumed after", f.worker)))
    else {
        return line;
    };
    let markers: Vec<&str> = FAILURE_MARKERS
        .iter()
        .chain(UNCLEAR_MARKERS)
        .copied()
        .collect();
    let n: usize = marked_times(logs, &markers)
        .iter()
        .filter(|(worker, _)| *worker == f.worker)
        .flat_map(|(_, times)| times)
        .filter(|t| f.covers(&f.worker, **t, GRACE))
        .count();
    format!("{line}; its own calls failed after retries (frozen, or just woken): {n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_by_their_time_in_either_log_format() {
        let dir = std::env::temp_dir().join(format!("jobfence-wlogs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("rust-1.log"),
            "2026-11-30T10:00:01.000000Z  WARN jobfence::worker::runner: claim failed error=x\n\
             2026-11-30T10:00:09.000000Z  WARN jobfence::worker::runner: claim failed error=late\n\
             2026-11-30T10:00:02.000000Z  INFO jobfence::refund_worker: refund worker started\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("python-1.log"),
            "2026-11-30 10:00:03,250 WARNING jobfence: claim outcome unknown (x): holding nothing\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("node-1.log"),
            "2026-11-30T10:00:02.500Z claim failed: no jobfence coordinator is serving\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("go-1.log"),
            "2026-11-30T10:00:03.5Z jobfence: claim failed, claiming again: x\n\
             2026-11-30T10:00:03.6Z go refund worker go-1 started\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("provider.log"),
            "2026-11-30T10:00:02Z WARN claim failed\n",
        )
        .unwrap();
        let at =
            |s: &str| -> SystemTime { chrono::DateTime::parse_from_rfc3339(s).unwrap().into() };
        let window = (at("2026-11-30T10:00:00Z"), at("2026-11-30T10:00:04Z"));
        let n = failures_between(&dir, window, GRACE, &[]);
        assert_eq!(n, 3);
        // Python's unclear claim is counted apart.
        assert_eq!(unclear_claims_between(&dir, window, GRACE, &[]), 1);
        // A worker frozen from 10:00:01 and resumed at 10:00:03: its
        // failures then and within the grace are the freeze's.
        let frozen = [Frozen {
            worker: "rust-1".into(),
            from: at("2026-11-30T10:00:01Z"),
            to: Some(at("2026-11-30T10:00:03Z")),
        }];
        assert_eq!(failures_between(&dir, window, GRACE, &frozen), 2);
        let line = with_frozen_cost("rust-1 resumed after 1 of its jobs".into(), &dir, &frozen);
        assert!(line.ends_with("(frozen, or just woken): 1"), "{line}");
        let other = with_frozen_cost("rust-2 killed".into(), &dir, &frozen);
        assert_eq!(other, "rust-2 killed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
