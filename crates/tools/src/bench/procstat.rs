//! CPU time and peak memory of a process, from Linux's `/proc`: the
//! coordinator's and the database server's, read before and after each
//! phase of the benchmark.

use std::time::Duration;

/// CPU time (user + system) of every thread of `pid`, from each thread's
/// `schedstat` (nanoseconds; finer than `stat`'s clock ticks). `None` if
/// the process cannot be read (gone, or another machine's).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total: u64 = 0;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    // Threads that ended took their time with them; `stat` keeps the
    // process-wide total (in clock ticks of 10 ms), so take the larger.
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces).
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = f.get(11)?.parse().ok()?;
            let stime: u64 = f.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    Some(Duration::from_nanos(total.max(ticks * 10_000_000)))
}

/// CPU time (user + system) of this process's children that ended and
/// were waited for (a command the benchmark ran, e.g. `jobfence settlement
/// import`): read before and after one, the difference is its CPU.
pub fn children_cpu() -> Option<Duration> {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
    let t = |v: nix::sys::time::TimeVal| {
        Duration::new(v.tv_sec().max(0) as u64, v.tv_usec().max(0) as u32 * 1000)
    };
    Some(t(u.user_time()) + t(u.system_time()))
}

/// Resets the process's peak resident set size (`VmHWM`) to its current
/// one, so the next [`peak_rss`] covers only what follows. Best effort.
pub fn reset_peak_rss(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// Peak resident set size (`VmHWM`), in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The CPU model and core count of this machine, for the report.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kib: u64 = m
                .lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(format!("{:.0} GiB", kib as f64 / 1024.0 / 1024.0))
        })
        .unwrap_or_else(|| "? GiB".into());
    format!("{cores} cores ({model}), {mem} memory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_a_peak_rss() {
        let pid = std::process::id();
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {}
        assert!(cpu_time(pid).unwrap() > Duration::ZERO);
        assert!(peak_rss(pid).unwrap() > 0);
    }
}
