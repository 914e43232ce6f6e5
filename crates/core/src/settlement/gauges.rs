//! The settlement gauges, read from every database: after each import or
//! action of this coordinator, and on the refresh interval (another
//! coordinator's import shows up there).

use crate::Coordinator;
use jobfence_metrics::{Metrics, SettlementReading};
use jobfence_store::shards::Shards;

/// Reads every database's settlement gauges and sets them; an error is
/// logged and the gauges keep their last values.
pub async fn refresh_settlement(shards: &Shards, metrics: &Metrics) {
    let mut readings = Vec::new();
    for (n, store) in shards.all() {
        match store.settlement_gauges().await {
            Ok(gauges) => readings.extend(gauges.into_iter().map(|g| SettlementReading {
                provider: g.provider,
                unresolved: g.unresolved,
                newest_period_end: g.newest_period_end,
                last_import: g.last_import,
            })),
            Err(e) => {
                tracing::warn!(database = n, error = %e, "settlement gauges not refreshed");
                return;
            }
        }
    }
    metrics.set_settlement(&readings);
}

impl Coordinator {
    /// [`refresh_settlement`] over this coordinator's databases.
    pub async fn refresh_settlement_gauges(&self) {
        refresh_settlement(self.shards(), &self.metrics).await;
    }
}
