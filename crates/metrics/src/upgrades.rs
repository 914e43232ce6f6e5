//! The rolling-upgrade series (docs/operating.md "Upgrading"): the build's
//! release, what the fleet check saw, and the backfills this coordinator
//! ran.

use super::Metrics;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

pub(super) struct UpgradeMetrics {
    pub(super) older_coordinators: IntGauge,
    pub(super) transition_open: IntGaugeVec,
    pub(super) backfills: IntCounterVec,
}

impl UpgradeMetrics {
    pub(super) fn new(r: &Registry, release: &str, schema_version: i64) -> Self {
        let build = IntGaugeVec::new(
            Opts::new(
                "jobfence_build_info",
                "Always 1: this coordinator's release, the newest migration it carries (its schema version) and the gRPC API version it serves.",
            ),
            &["version", "schema_version", "api_version"],
        )
        .expect("valid gauge");
        build
            .with_label_values(&[release, &schema_version.to_string(), jobfence_api::VERSION])
            .set(1);
        let older_coordinators = IntGauge::new(
            "jobfence_older_coordinators",
            "Coordinators of an older release seen by the last fleet check (by their heartbeat, or a session of the coordinators' database user that no jobfence process of 0.2.0 or newer registered). Above 0: newer coordinators keep the older behaviour where the two would disagree.",
        )
        .expect("valid gauge");
        let transition_open = IntGaugeVec::new(
            Opts::new(
                "jobfence_schema_transition_open",
                "1 while this coordinator keeps the older behaviour a schema transition exists for (its backfill has not run: older coordinators may still be alive, or its first checks have not shown otherwise), by transition; 0 once it has.",
            ),
            &["transition"],
        )
        .expect("valid gauge");
        let backfills = IntCounterVec::new(
            Opts::new(
                "jobfence_schema_backfills_total",
                "Schema transitions this coordinator brought forward (their backfill), by transition.",
            ),
            &["transition"],
        )
        .expect("valid counter");
        // Present from the start, at 0: an alert on increase() sees the
        // first one.
        backfills.with_label_values(&["observations_flag"]);
        transition_open.with_label_values(&["observations_flag"]);
        for c in [
            Box::new(build) as Box<dyn prometheus::core::Collector>,
            Box::new(older_coordinators.clone()),
            Box::new(transition_open.clone()),
            Box::new(backfills.clone()),
        ] {
            r.register(c).expect("unique metric name");
        }
        UpgradeMetrics {
            older_coordinators,
            transition_open,
            backfills,
        }
    }
}

impl Metrics {
    /// What the last fleet check saw: `older` coordinators, and each
    /// transition with whether it is still open.
    pub fn set_fleet(&self, older: usize, transitions: &[(String, bool)]) {
        let u = &self.inner.upgrades;
        u.older_coordinators
            .set(i64::try_from(older).unwrap_or(i64::MAX));
        for (name, open) in transitions {
            u.transition_open
                .with_label_values(&[name])
                .set(i64::from(*open));
        }
    }

    /// A backfill this coordinator ran.
    pub fn backfilled(&self, transition: &str) {
        self.inner
            .upgrades
            .backfills
            .with_label_values(&[transition])
            .inc();
    }
}
