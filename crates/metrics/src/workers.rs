//! The workers gauge (docs/operating.md "Workers"): live and stale workers
//! seen across coordinators, set by each coordinator after it writes its
//! sightings (every 5 s).

use super::Metrics;
use prometheus::{IntGaugeVec, Opts, Registry};

pub(super) struct WorkerMetrics {
    pub(super) workers: IntGaugeVec,
}

impl WorkerMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let workers = IntGaugeVec::new(
            Opts::new(
                "jobfence_workers",
                "Workers seen in the last 15 minutes by any coordinator (read from the database every 5 s), by state: live (a call in the last minute, or a lease not yet ended) or stale. 0 live with ready jobs: nobody is working.",
            ),
            &["state"],
        )
        .expect("valid gauge");
        r.register(Box::new(workers.clone()))
            .expect("unique metric name");
        for state in ["live", "stale"] {
            workers.with_label_values(&[state]);
        }
        WorkerMetrics { workers }
    }
}

impl Metrics {
    /// Sets the workers gauge: `live` and `stale` workers.
    pub fn set_workers(&self, live: usize, stale: usize) {
        let g = &self.inner.workers.workers;
        g.with_label_values(&["live"])
            .set(i64::try_from(live).unwrap_or(i64::MAX));
        g.with_label_values(&["stale"])
            .set(i64::try_from(stale).unwrap_or(i64::MAX));
    }
}
