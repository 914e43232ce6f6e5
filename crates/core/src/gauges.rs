//! The gauges read from the databases rather than counted: the pending
//! ages (on the refresh interval), the provider gauges, the retention
//! gauges, and what each
//! store counts itself (pool, conflicts, node in use; at scrape time).
//! They live here, beside the coordinator that owns the stores, because
//! the metrics crate knows no database.

use jobfence_domain::admin::PendingAges;
use jobfence_domain::CoordinatorError;
use jobfence_metrics::{Metrics, StoreReadings};
use jobfence_store::shards::Shards;
use jobfence_store::JobStore;

/// Reads the pending ages from the database and sets the gauges. An error
/// is counted and logged; the gauges keep their last values.
pub async fn refresh_pending(store: &JobStore, metrics: &Metrics) -> Result<(), CoordinatorError> {
    record_pending(store.pending_ages().await, metrics)
}

/// [`refresh_pending`] over every database of a coordinator (the oldest of
/// each queue wins).
pub async fn refresh_pending_all(
    shards: &Shards,
    metrics: &Metrics,
) -> Result<(), CoordinatorError> {
    record_pending(shards.pending_ages().await, metrics)
}

fn record_pending(
    ages: Result<PendingAges, CoordinatorError>,
    metrics: &Metrics,
) -> Result<(), CoordinatorError> {
    match ages {
        Ok(ages) => {
            metrics.set_pending(&ages);
            metrics.pending_refreshed(true);
            Ok(())
        }
        Err(e) => {
            metrics.pending_refreshed(false);
            tracing::warn!(error = %e, "pending-age gauges not refreshed");
            Err(e)
        }
    }
}

/// Sets the provider gauges (units available, in flight, paused,
/// throttled) from every database; on an error they keep their values.
pub async fn refresh_providers(shards: &Shards, metrics: &Metrics) {
    let mut all = Vec::new();
    for (n, store) in shards.all() {
        match store.list_providers().await {
            Ok(found) => all.extend(found),
            Err(e) => {
                tracing::warn!(database = n, error = %e, "provider gauges not refreshed");
                return;
            }
        }
    }
    metrics.set_providers(&all);
}

/// Reads what the stores count themselves, now, into the gauges: the node
/// each database is reached through, the pools (summed over the
/// databases) and the conflict counters.
pub fn read_stores(shards: &Shards, metrics: &Metrics) {
    let mut read = StoreReadings::default();
    for (n, store) in shards.all() {
        read.nodes.push((*n, store.current_node()));
        let pool = store.pool_stats();
        read.connections += pool.connections;
        read.idle += pool.idle;
        read.max_connections += pool.max_connections;
        let (retried, reported) = store.conflicts();
        read.retried += retried;
        read.reported += reported;
    }
    metrics.set_stores(&read);
}

/// Sets the retention gauges from every database: key records summed, the
/// oldest finished job's age and the earliest last pruning run (the worst)
/// kept. Counts `operation_keys` (an index scan): the serve loop calls it
/// at most once a minute, and after each pruning run.
pub async fn refresh_retention(shards: &Shards, metrics: &Metrics) {
    let (mut last, mut oldest, mut keys) = (None::<f64>, None::<f64>, 0u64);
    for (n, store) in shards.all() {
        match store.retention_stats().await {
            Ok(s) => {
                keys += s.key_records;
                let age = s.oldest_finished_age.map(|d| d.as_secs_f64());
                oldest = match (oldest, age) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                last = match (last, s.last_run_unix) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            Err(e) => {
                tracing::warn!(database = n, error = %e, "retention gauges not refreshed");
                return;
            }
        }
    }
    metrics.set_retention(last, oldest, keys);
}
