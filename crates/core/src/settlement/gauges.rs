//! The settlement gauges, read from every database.

use crate::Coordinator;
use jobfence_metrics::SettlementReading;

impl Coordinator {
    /// Reads every database's settlement gauges and sets them; an error is
    /// logged and the gauges keep their last values.
    pub async fn refresh_settlement_gauges(&self) {
        let mut readings = Vec::new();
        for (n, store) in self.shards().all() {
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
        self.metrics.set_settlement(&readings);
    }
}
