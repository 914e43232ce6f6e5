//! Calls that failed at the workers, read back from their logs: a worker
//! logs a warning for each call that still failed after its own retries
//! (a claim, a write back, a release). Counting those that fall inside a
//! fault's time window tells what the fault cost the workers.

use std::path::Path;
use std::time::SystemTime;

/// What a worker's warning says when a call to the coordinator failed
/// after the client's retries (Rust SDK, refund worker, Python worker).
const FAILURE_MARKERS: [&str; 5] = [
    "claim failed",
    "claim outcome unknown",
    "write back failed",
    "could not release",
    "could not record",
];

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

/// Failed worker calls logged in `logs` (the workers' log files) between
/// `from` and `to` (inclusive), and up to `grace` after `to` (a call that
/// started during the fault may fail a little after it).
pub fn failures_between(
    logs: &Path,
    from: SystemTime,
    to: SystemTime,
    grace: std::time::Duration,
) -> usize {
    let Ok(dir) = std::fs::read_dir(logs) else {
        return 0;
    };
    let until = to + grace;
    let mut n = 0;
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_worker = ["rust-", "python-", "node-", "go-"]
            .iter()
            .any(|p| name.starts_with(p));
        if !is_worker {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        n += text
            .lines()
            .filter(|l| FAILURE_MARKERS.iter().any(|m| l.contains(m)))
            .filter_map(line_time)
            .filter(|t| *t >= from && *t <= until)
            .count();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        let n = failures_between(
            &dir,
            at("2026-11-30T10:00:00Z"),
            at("2026-11-30T10:00:04Z"),
            Duration::from_secs(1),
        );
        assert_eq!(n, 4);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
