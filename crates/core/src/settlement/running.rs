//! The settlement imports this coordinator is running, each with how far
//! it has come and how it is paced (`jobfence_domain::pacing`): what
//! `ListSettlementImports` answers, and so what an importer's progress
//! line says while its import runs. An import is listed from its start to
//! its end, on the coordinator it runs through only.

use super::super::Coordinator;
use jobfence_domain::pacing::Pace;
use jobfence_metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One running import.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportProgress {
    /// The name the importer gave it (`ImportSettlementHeader.import_id`;
    /// empty when it gave none).
    pub import_id: String,
    pub provider: String,
    pub operator: String,
    /// How long it has run.
    pub running: Duration,
    /// Report lines read so far.
    pub lines_read: u64,
    /// What its pacing last found; how long it has rested so far to leave
    /// the database to the workers.
    pub pace: Pace,
    pub yielded: Duration,
}

#[derive(Debug)]
struct Entry {
    progress: ImportProgress,
    started: Instant,
}

/// The running imports of one coordinator.
#[derive(Debug, Default, Clone)]
pub(crate) struct Running {
    inner: Arc<Mutex<(u64, BTreeMap<u64, Entry>)>>,
}

/// An import's place in [`Running`]: removed when dropped, however the
/// import ends, and the pacing gauges set from the imports still running
/// (back to 0 after the last).
#[derive(Debug)]
pub(crate) struct Listed {
    running: Running,
    key: u64,
    metrics: Metrics,
}

impl Running {
    pub(crate) fn add(&self, progress: ImportProgress, metrics: &Metrics) -> Listed {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        let key = g.0;
        g.1.insert(
            key,
            Entry {
                progress,
                started: Instant::now(),
            },
        );
        Listed {
            running: self.clone(),
            key,
            metrics: metrics.clone(),
        }
    }

    fn list(&self) -> Vec<ImportProgress> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.1.values()
            .map(|e| ImportProgress {
                running: e.started.elapsed(),
                ..e.progress.clone()
            })
            .collect()
    }
}

impl Listed {
    /// Changes what the listing shows of this import, and sets the
    /// pacing gauges from every running import's pace.
    pub(crate) fn update(&self, f: impl FnOnce(&mut ImportProgress)) {
        let mut g = self.running.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = g.1.get_mut(&self.key) {
            f(&mut e.progress);
        }
        gauges(&self.metrics, &g.1);
    }
}

/// The pacing gauges of every import in `running` (one import's pace
/// never hides another's).
fn gauges(metrics: &Metrics, running: &BTreeMap<u64, Entry>) {
    metrics.paced(super::WORK, running.values().map(|e| &e.progress.pace));
}

impl Drop for Listed {
    fn drop(&mut self) {
        let mut g = self.running.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.1.remove(&self.key);
        gauges(&self.metrics, &g.1);
    }
}

impl Coordinator {
    /// The settlement imports this coordinator is running, oldest first;
    /// only `provider`'s, and only the one named `import_id`, when given
    /// (non-empty).
    pub fn settlement_imports(&self, provider: &str, import_id: &str) -> Vec<ImportProgress> {
        self.pipelines
            .imports
            .list()
            .into_iter()
            .filter(|p| provider.is_empty() || p.provider == provider)
            .filter(|p| import_id.is_empty() || p.import_id == import_id)
            .collect()
    }
}
