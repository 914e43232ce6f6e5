//! The pruner (docs/design.md rule 14): runs the store's pruning over every
//! database of the coordinator, on an interval inside `jobfence serve` or
//! once (`jobfence prune`), and records what it did in the metrics.

use super::Coordinator;
use crate::archive::ArchiveFile;
use jobfence_domain::retention::RetentionError;
use jobfence_domain::{CoordinatorError, PruneCounts, Retention};
use jobfence_store::archive::PruneArchive;
use jobfence_store::retention::{PruneRun, DEFAULT_PRUNE_BATCH};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use jobfence_store::retention::DEFAULT_PRUNE_REST;

/// How the pruner runs.
#[derive(Debug, Clone, PartialEq)]
pub struct PrunerSettings {
    /// How long finished jobs and key records are kept.
    pub retention: Retention,
    /// Most jobs one pruning transaction deletes.
    pub batch: u32,
    /// Time between two runs inside `serve`.
    pub interval: Duration,
    /// After each batch, rest this many times as long as it took (see
    /// `JobStore::prune_paced`).
    pub rest: f64,
    /// When set, each run writes the rows it deletes to a gzip'd
    /// JSON-lines file in this directory first (see [`crate::archive`]).
    pub archive_dir: Option<PathBuf>,
}

impl PrunerSettings {
    /// Settings with the documented defaults: jobs kept 30 days, key
    /// records forever, batches of [`DEFAULT_PRUNE_BATCH`], a run a minute.
    pub fn defaults() -> Self {
        PrunerSettings {
            retention: Retention {
                jobs: Duration::from_secs(30 * 86_400),
                keys: None,
            },
            batch: DEFAULT_PRUNE_BATCH,
            interval: Duration::from_secs(60),
            rest: DEFAULT_PRUNE_REST,
            archive_dir: None,
        }
    }

    /// Checks the retention (see [`Retention::check`]): refused at start,
    /// never discovered by a run.
    pub fn check(&self) -> Result<(), RetentionError> {
        self.retention.check()
    }
}

/// What one run did on each database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Per database (its number): what was removed, or `None` when another
    /// coordinator held that database's pruner lock.
    pub databases: Vec<(u32, Option<PruneCounts>)>,
    /// Per database (its number): the archive file this run wrote, if it
    /// archived anything.
    pub archives: Vec<(u32, PathBuf)>,
}

impl PruneReport {
    /// The counts summed over the databases that ran.
    pub fn total(&self) -> PruneCounts {
        let mut t = PruneCounts::default();
        for c in self.databases.iter().filter_map(|(_, c)| c.as_ref()) {
            t.add(*c);
        }
        t
    }
}

/// Ends a run's archive file (fsync, rename, directory fsync) on a
/// blocking thread, off the async runtime.
async fn finish_blocking(archive: Arc<ArchiveFile>) -> Result<Option<PathBuf>, String> {
    tokio::task::spawn_blocking(move || match Arc::into_inner(archive) {
        Some(file) => file.finish(),
        None => Err("the archive was still in use when its run ended".into()),
    })
    .await
    .unwrap_or_else(|e| Err(format!("the archive's closing thread failed: {e}")))
}

impl Coordinator {
    /// One pruning run over every database, one after the other (see
    /// `JobStore::prune`); `progress` is called after each batch with the
    /// database's number and its counts so far. Counts what was deleted
    /// and sets the retention gauges. The first error stops the run.
    pub async fn prune_once(
        &self,
        settings: &PrunerSettings,
        mut progress: impl FnMut(u32, &PruneCounts),
    ) -> Result<PruneReport, CoordinatorError> {
        let mut databases = Vec::new();
        let mut archives = Vec::new();
        for (n, store) in self.shards().all() {
            let n = *n;
            let archive = match &settings.archive_dir {
                Some(dir) => Some(Arc::new(ArchiveFile::new(dir, &store.schema_name().await?))),
                None => None,
            };
            let run = store
                .prune_archived(
                    &settings.retention,
                    settings.batch,
                    settings.rest,
                    archive.clone().map(|a| a as Arc<dyn PruneArchive>),
                    |c| progress(n, c),
                )
                .await;
            let archived = match archive {
                Some(a) => Some(finish_blocking(a).await),
                None => None,
            };
            let run = match (run, archived) {
                (Err(e), _) => return Err(e),
                (Ok(_), Some(Err(why))) => return Err(CoordinatorError::Internal(why)),
                (Ok(run), Some(Ok(Some(path)))) => {
                    archives.push((n, path));
                    run
                }
                (Ok(run), _) => run,
            };
            match run {
                PruneRun::Done(counts) => {
                    self.metrics().pruned(&counts);
                    databases.push((n, Some(counts)));
                }
                PruneRun::LockHeld => databases.push((n, None)),
            }
        }
        super::gauges::refresh_retention(self.shards(), self.metrics()).await;
        Ok(PruneReport {
            databases,
            archives,
        })
    }

    /// Runs the pruner every `settings.interval` until the task is
    /// aborted: the first run one interval after start. A run that fails
    /// is logged and tried again at the next interval.
    pub fn spawn_pruner(&self, settings: PrunerSettings) -> tokio::task::JoinHandle<()> {
        let coordinator = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(settings.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match coordinator.prune_once(&settings, |_, _| {}).await {
                    Ok(report) => {
                        let t = report.total();
                        if t.jobs > 0 || t.keys_pruned > 0 {
                            tracing::info!(
                                jobs = t.jobs,
                                observations = t.observations,
                                events = t.events,
                                key_records_written = t.keys_recorded,
                                key_records_pruned = t.keys_pruned,
                                batches = t.batches,
                                archived_jobs = t.archived_jobs,
                                archives = ?report.archives,
                                "pruned finished jobs"
                            );
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "pruning run failed; trying again at the next interval")
                    }
                }
            }
        })
    }
}
