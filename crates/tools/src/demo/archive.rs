//! The demo's check of the pruner's archive (`--prune-archive-dir`): every
//! job the coordinators pruned must be in one of its files. A file a
//! killed coordinator left as `….partial` is read up to where it ends:
//! what a batch deleted was fsynced before its commit.

use anyhow::{Context, Result};
use flate2::read::GzDecoder;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// What the archive directory holds.
#[derive(Debug, Default)]
pub(super) struct Archived {
    /// Files read (`.jsonl.gz` and `.partial`).
    pub(super) files: usize,
    /// Lines per job id (more than one: a batch whose commit failed after
    /// its write was archived again when it was pruned).
    pub(super) jobs: BTreeMap<u64, u32>,
    /// The archived `stale_write_rejected` events: (job id, event id) →
    /// the RPC refused (the event's detail up to its first `:`).
    pub(super) stale: BTreeMap<(u64, u64), String>,
    /// The archived succeeded jobs: job id → the worker that completed
    /// it (its lease owner).
    pub(super) completed: BTreeMap<u64, String>,
    /// The archived jobs' first hand-outs (see `fairness.rs`).
    pub(super) waits: super::fairness::Waits,
}

/// Reads every archive file of `dir`.
pub(super) fn read(dir: &Path) -> Result<Archived> {
    let mut archived = Archived::default();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let partial = name.ends_with(".jsonl.gz.partial");
        if !name.ends_with(".jsonl.gz") && !partial {
            continue;
        }
        archived.files += 1;
        let file = std::fs::File::open(&path)?;
        for line in BufReader::new(GzDecoder::new(file)).lines() {
            let line = match line {
                Ok(line) => line,
                // A file its coordinator never ended has no trailer.
                Err(_) if partial => break,
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            };
            let v: serde_json::Value = match serde_json::from_str(&line) {
                Ok(v) => v,
                // The last, unflushed line of a killed coordinator's file.
                Err(_) if partial => break,
                Err(e) => return Err(e).with_context(|| format!("a line of {}", path.display())),
            };
            let id = v["job"]["id"]
                .as_u64()
                .with_context(|| format!("a line without job.id in {}", path.display()))?;
            *archived.jobs.entry(id).or_default() += 1;
            if let Some((job, wait)) = super::fairness::archived(&v) {
                archived.waits.insert(job, wait);
            }
            if v["job"]["state"] == "succeeded" {
                if let Some(worker) = v["job"]["lease_owner"].as_str() {
                    archived.completed.insert(id, worker.to_owned());
                }
            }
            for e in v["events"].as_array().into_iter().flatten() {
                if e["kind"] == "stale_write_rejected" {
                    let (Some(event), Some(detail)) = (e["id"].as_u64(), e["detail"].as_str())
                    else {
                        continue;
                    };
                    let rpc = detail.split(':').next().unwrap_or(detail);
                    archived.stale.insert((id, event), rpc.to_owned());
                }
            }
        }
    }
    Ok(archived)
}
