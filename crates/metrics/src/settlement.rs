//! Settlement's metrics (docs/design.md rule 15, docs/settlement.md):
//! report lines imported by what became of them, manual
//! reviews settlement resolved, and, from the database on the refresh
//! interval and after each import, the exceptions not resolved by kind and
//! severity, the newest covered period and the last import.

use jobfence_domain::settlement::{ExceptionKind, ExceptionState};
use prometheus::{Gauge, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// What the database says of one provider's settlement, for the gauges.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SettlementReading {
    pub provider: String,
    /// Exceptions open or acknowledged, by kind and state.
    pub unresolved: Vec<(ExceptionKind, ExceptionState, u64)>,
    /// The end of the newest covered period (Unix seconds), if any.
    pub newest_period_end: Option<f64>,
    /// The last import of any period (Unix seconds), if any.
    pub last_import: Option<f64>,
}

pub(super) struct SettlementMetrics {
    pub(super) lines: IntCounterVec,
    pub(super) resolved: IntCounterVec,
    unresolved: IntGaugeVec,
    newest_period_end: GaugeVec,
    last_import: GaugeVec,
    seen: Mutex<BTreeSet<String>>,
}

impl SettlementMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let lines = IntCounterVec::new(
            Opts::new(
                "jobfence_settlement_lines_total",
                "Lines of providers' settlement reports this coordinator imported, by what became of them: new, updated (a new status), unchanged (imported before), refused (malformed, with its line number in the import's summary).",
            ),
            &["provider", "result"],
        )
        .expect("valid counter");
        let resolved = IntCounterVec::new(
            Opts::new(
                "jobfence_settlement_resolved_reviews_total",
                "Jobs in manual review this coordinator's settlement imports resolved to succeeded, from a settled refund in the provider's report (through the operator's fenced resolution, recorded as 'settlement').",
            ),
            &["provider"],
        )
        .expect("valid counter");
        let unresolved = IntGaugeVec::new(
            Opts::new(
                "jobfence_settlement_exceptions",
                "Settlement exceptions not resolved, by provider, kind, severity and state (open: nobody has looked; acknowledged: someone is on it). DOUBLE_REFUND, REFUND_NOT_RECORDED and MISSING_AT_PROVIDER are critical. From the database.",
            ),
            &["provider", "kind", "severity", "state"],
        )
        .expect("valid gauge");
        let newest_period_end = GaugeVec::new(
            Opts::new(
                "jobfence_settlement_newest_period_end_timestamp_seconds",
                "End of the newest period a provider's imported reports cover (Unix seconds; 0: none). time() minus it is how far behind settlement is.",
            ),
            &["provider"],
        )
        .expect("valid gauge");
        let last_import = GaugeVec::new(
            Opts::new(
                "jobfence_settlement_last_import_timestamp_seconds",
                "When a provider's report was last imported, by any coordinator (Unix seconds, DB clock; 0: never).",
            ),
            &["provider"],
        )
        .expect("valid gauge");
        for c in [&lines, &resolved] {
            r.register(Box::new(c.clone())).expect("unique metric name");
        }
        r.register(Box::new(unresolved.clone()))
            .expect("unique metric name");
        for g in [&newest_period_end, &last_import] {
            r.register(Box::new(g.clone())).expect("unique metric name");
        }
        SettlementMetrics {
            lines,
            resolved,
            unresolved,
            newest_period_end,
            last_import,
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// Sets every provider's gauges; every kind of every provider is
    /// present (0 when none), and a provider no longer read reads 0.
    pub(super) fn set(&self, readings: &[SettlementReading]) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let now: BTreeSet<String> = readings.iter().map(|r| r.provider.clone()).collect();
        const STATES: [ExceptionState; 2] = [ExceptionState::Open, ExceptionState::Acknowledged];
        // Each series set once, to its final value: a scrape never sees a
        // count dip to 0 between two writes.
        let set_counts = |provider: &str, counts: &[(ExceptionKind, ExceptionState, u64)]| {
            for kind in ExceptionKind::ALL {
                for state in STATES {
                    let n = counts
                        .iter()
                        .find(|(k, s, _)| *k == kind && *s == state)
                        .map_or(0, |(_, _, n)| *n);
                    self.unresolved
                        .with_label_values(&[
                            provider,
                            kind.as_str(),
                            kind.severity().as_str(),
                            state.as_str(),
                        ])
                        .set(i64::try_from(n).unwrap_or(i64::MAX));
                }
            }
        };
        for gone in seen.difference(&now) {
            set_counts(gone, &[]);
        }
        for r in readings {
            set_counts(&r.provider, &r.unresolved);
            let set = |g: &GaugeVec, v: Option<f64>| {
                let gauge: Gauge = g.with_label_values(&[&r.provider]);
                gauge.set(v.unwrap_or(0.0));
            };
            set(&self.newest_period_end, r.newest_period_end);
            set(&self.last_import, r.last_import);
            for result in ["new", "updated", "unchanged", "refused"] {
                self.lines.with_label_values(&[&r.provider, result]);
            }
            self.resolved.with_label_values(&[&r.provider]);
        }
        *seen = now;
    }
}
