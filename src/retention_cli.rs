//! `jobfence prune` and the retention flags `jobfence serve` shares with
//! it (docs/design.md rule 14; docs/operating.md, "Retention").

use crate::cli::DatabaseArgs;
use clap::Args;
use jobfence_core::retention::PrunerSettings;
use jobfence_core::{Coordinator, CoordinatorConfig};
use jobfence_domain::Retention;
use jobfence_store::shards::Shards;
use std::process::ExitCode;
use std::time::Duration;

/// How long finished jobs and their key records are kept (docs/design.md rule
/// 14; docs/operating.md, "Retention").
#[derive(Debug, Args)]
pub struct RetentionArgs {
    /// Finished jobs (succeeded, failed, cancelled) are pruned, with their
    /// observations and events, this long after they finished (DB clock).
    /// A queue's stored policy may say otherwise (`queue-policies set
    /// --retention`). This is also how long an events consumer may be
    /// away. Jobs in ready, running or manual_review are never pruned.
    #[arg(long, env = "JOBFENCE_RETENTION_JOBS", value_parser = humantime::parse_duration, default_value = "30d")]
    pub retention_jobs: Duration,
    /// How long the key record of a pruned job (queue, operation_key,
    /// payload digest, job id, final state, provider reference) is kept,
    /// from the job's finish: a retried Enqueue of the key answers the old
    /// job while it is. Forever when unset (the default); a shorter value
    /// than --retention-jobs is refused at start.
    #[arg(long, env = "JOBFENCE_RETENTION_KEYS", value_parser = humantime::parse_duration)]
    pub retention_keys: Option<Duration>,
    /// Most jobs one pruning transaction deletes (its locks are held for
    /// that batch only).
    #[arg(long, env = "JOBFENCE_PRUNE_BATCH", default_value_t = jobfence_store::retention::DEFAULT_PRUNE_BATCH)]
    pub prune_batch: u32,
    /// After each pruning batch, rest this many times as long as the batch
    /// took: 3 keeps the pruner's session busy at most a quarter of the
    /// time, leaving the database's CPU to live jobs; 0 prunes flat out.
    #[arg(long, env = "JOBFENCE_PRUNE_REST", default_value_t = jobfence_core::retention::DEFAULT_PRUNE_REST)]
    pub prune_rest: f64,
    /// Before deleting, write the rows each pruning run removes (every job
    /// with its observations and events, one JSON object per line) to a
    /// gzip'd file in this directory, `jobfence-prune-<UTC time>-<schema>.jsonl.gz`,
    /// fsynced before each batch commits: a failed write stops the run
    /// and deletes nothing unarchived. Unset: no archive.
    #[arg(long, env = "JOBFENCE_PRUNE_ARCHIVE_DIR")]
    pub prune_archive_dir: Option<std::path::PathBuf>,
}

impl RetentionArgs {
    /// The pruner's settings, checked: a key retention shorter than the job
    /// retention (or one under a second) is refused with the reason.
    pub fn settings(&self, interval: Duration) -> anyhow::Result<PrunerSettings> {
        let settings = PrunerSettings {
            retention: Retention {
                jobs: self.retention_jobs,
                keys: self.retention_keys,
            },
            batch: self.prune_batch.max(1),
            interval,
            rest: self.prune_rest,
            archive_dir: self.prune_archive_dir.clone(),
        };
        settings
            .check()
            .map_err(|e| anyhow::anyhow!("refusing the retention settings: {e}"))?;
        Ok(settings)
    }
}

/// The flags of `jobfence prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
}

/// Aborts a task when dropped (the pruner, when `serve` returns).
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `jobfence prune`: one run, a progress line per batch on stdout.
pub async fn prune(shards: Shards, settings: PrunerSettings) -> anyhow::Result<ExitCode> {
    let coordinator = Coordinator::over_shards(shards, CoordinatorConfig::default());
    let line = |n: u32, c: &jobfence_domain::PruneCounts| {
        format!(
            "database {n}: {} batches, pruned {} jobs, {} observations, {} events; {} key records written, {} key records pruned",
            c.batches, c.jobs, c.observations, c.events, c.keys_recorded, c.keys_pruned
        ) + &if c.archived_jobs > 0 {
            format!("; {} jobs archived ({} bytes)", c.archived_jobs, c.archived_bytes)
        } else {
            String::new()
        }
    };
    let report = coordinator
        .prune_once(&settings, |n, c| println!("{}", line(n, c)))
        .await?;
    let mut held = false;
    for (n, counts) in &report.databases {
        match counts {
            Some(c) => {
                let archive = report.archives.iter().find(|(a, _)| a == n);
                match archive {
                    Some((_, path)) => {
                        println!("done: {}; archive {}", line(*n, c), path.display())
                    }
                    None => println!("done: {}", line(*n, c)),
                }
            }
            None => {
                held = true;
                println!("database {n}: another coordinator is pruning it; left to it");
            }
        }
    }
    Ok(if held {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
