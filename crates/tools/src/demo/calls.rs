//! The worker calls per job: what the coordinators answered the workers,
//! read from their metrics before each one stops (a restart, a kill) and
//! at the end, so that a restart, which starts its counters again, loses
//! none.

use super::coordinators::Coordinators;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// The methods a worker's run loop calls for its jobs.
const WORKER_METHODS: [&str; 5] = ["Claim", "Takeover", "Complete", "Fail", "RenewLease"];

/// Worker calls answered by the coordinators, by method, and the jobs the
/// Completes and Fails handed out with their write (docs/design.md rule
/// 16).
#[derive(Debug, Default, Clone)]
pub struct WorkerCalls {
    pub by_method: BTreeMap<&'static str, u64>,
    pub handed_on_write: u64,
}

impl WorkerCalls {
    /// Adds what one coordinator's `/metrics` text counted.
    pub fn add(&mut self, metrics: &str) {
        for line in metrics.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if series.starts_with("jobfence_jobs_handed_on_write_total{") {
                self.handed_on_write += value as u64;
            }
            if !series.starts_with("jobfence_rpc_duration_seconds_count{")
                || !series.contains("service=\"jobfence.v1.JobCoordinator\"")
            {
                continue;
            }
            if let Some(m) = WORKER_METHODS
                .iter()
                .find(|m| series.contains(&format!("method=\"{m}\"")))
            {
                *self.by_method.entry(m).or_default() += value as u64;
            }
        }
    }

    /// All worker calls.
    pub fn total(&self) -> u64 {
        self.by_method.values().sum()
    }

    /// The report's line: calls per job finished, by method, and how many
    /// jobs came with a write.
    pub fn render(&self, s: &mut String, finished: i64) {
        if self.total() == 0 {
            return;
        }
        let per_job = self.total() as f64 / finished.max(1) as f64;
        let methods: Vec<String> = self
            .by_method
            .iter()
            .map(|(m, n)| format!("{m} {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  worker calls per job    {per_job:.2} ({}; {} jobs came with the Complete or Fail before them, in its transaction)",
            methods.join(", "),
            self.handed_on_write
        );
    }
}

impl Coordinators {
    /// Adds coordinator `i`'s worker calls so far to [`Coordinators::calls`]
    /// (before it stops: its counters die with it).
    pub(super) async fn keep_calls(&mut self, i: usize) {
        let url = format!("http://{}/metrics", self.list[i].metrics);
        let text = match reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        self.calls.add(&text);
    }

    /// Every worker call the coordinators answered: those of the stopped
    /// ones and what the running ones count now.
    pub async fn worker_calls(&self) -> WorkerCalls {
        let mut calls = self.calls.clone();
        for text in self.scrape().await {
            calls.add(&text);
        }
        calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_worker_methods_of_every_code_and_the_jobs_handed_on_write() {
        let mut calls = WorkerCalls::default();
        calls.add(
            "jobfence_rpc_duration_seconds_count{code=\"OK\",method=\"Claim\",service=\"jobfence.v1.JobCoordinator\"} 3\n\
             jobfence_rpc_duration_seconds_count{code=\"FAILED_PRECONDITION\",method=\"Complete\",service=\"jobfence.v1.JobCoordinator\"} 1\n\
             jobfence_rpc_duration_seconds_count{code=\"OK\",method=\"Complete\",service=\"jobfence.v1.JobCoordinator\"} 9\n\
             jobfence_rpc_duration_seconds_count{code=\"OK\",method=\"Enqueue\",service=\"jobfence.v1.JobCoordinator\"} 50\n\
             jobfence_rpc_duration_seconds_count{code=\"OK\",method=\"ListJobs\",service=\"jobfence.v1.JobAdmin\"} 7\n\
             jobfence_jobs_handed_on_write_total{queue=\"refunds\"} 6\n",
        );
        calls.add("jobfence_rpc_duration_seconds_count{code=\"OK\",method=\"Claim\",service=\"jobfence.v1.JobCoordinator\"} 2\n");
        assert_eq!(calls.by_method.get("Claim"), Some(&5));
        assert_eq!(calls.by_method.get("Complete"), Some(&10));
        assert_eq!(calls.total(), 15);
        assert_eq!(calls.handed_on_write, 6);
        let mut s = String::new();
        calls.render(&mut s, 10);
        assert!(s.contains("1.50 (Claim 5, Complete 10; 6 jobs"), "{s}");
    }
}
