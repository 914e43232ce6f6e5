//! The provider-budget metrics (docs/design.md rules 11–12), per provider:
//! what is handed out and by which next action (so the share of the
//! provider's traffic that reconciles eat, the seed's fourth metric, is a
//! ratio of two series), what the budget held back and why, throttle
//! reports, and the state read from the database on the refresh interval
//! (units available, jobs in flight, paused, throttled).

use jobfence_domain::budget::{Holdback, Pause};
use jobfence_domain::providers::ProviderRecord;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// The `cause` label values of the deferred hand-outs counter.
pub const HOLDBACK_CAUSES: [Holdback; 5] = [
    Holdback::Rate,
    Holdback::FairShare,
    Holdback::InFlight,
    Holdback::Paused,
    Holdback::Throttled,
];

pub(super) struct ProviderMetrics {
    handouts: IntCounterVec,
    deferred: IntCounterVec,
    throttle_reports: IntCounterVec,
    units_available: IntGaugeVec,
    in_flight: IntGaugeVec,
    paused: IntGaugeVec,
    throttled_seconds: GaugeVec,
    /// Every provider the gauges were set for: one deleted since reads 0.
    seen: Mutex<BTreeSet<String>>,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    r.register(Box::new(c.clone())).expect("unique metric name");
    c
}

fn int_gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric name");
    g
}

impl ProviderMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let throttled_seconds = GaugeVec::new(
            Opts::new(
                "jobfence_provider_throttled_seconds",
                "Seconds left of the Retry-After a worker reported for the provider (its 429), during which nothing is handed out for it; 0 when not throttled. From the database, on the refresh interval.",
            ),
            &["provider"],
        )
        .expect("valid gauge");
        r.register(Box::new(throttled_seconds.clone()))
            .expect("unique metric name");
        ProviderMetrics {
            handouts: counter(
                r,
                "jobfence_provider_handouts_total",
                "Jobs this coordinator handed out for a provider, by next_action (execute: a first send or a resend; reconcile: a lookup, every takeover's first step). Each spent the provider's budget. The reconcile share of the provider's traffic is reconcile / (execute + reconcile).",
                &["provider", "next_action"],
            ),
            deferred: counter(
                r,
                "jobfence_provider_deferred_total",
                "Due jobs a claim found but did not hand out because of the provider's budget, by cause: rate (no units left), fair_share (units left for another queue of the provider), in_flight (the cap on jobs in flight), paused (an operator's pause), throttled (the provider's Retry-After), key_cap (the job's fairness key is at its cap, docs/design.md rule 18). They stay ready and are handed out later.",
                &["provider", "cause"],
            ),
            throttle_reports: counter(
                r,
                "jobfence_provider_throttle_reports_total",
                "Fail calls through this coordinator that reported the provider's 429 / Retry-After (each holds the provider's hand-outs on every coordinator until then).",
                &["provider"],
            ),
            units_available: int_gauge(
                r,
                "jobfence_provider_units_available",
                "Whole units of the provider's budget that could be spent now (0..burst), by the database clock. From the database on the refresh interval, and after each claim of its queues through this coordinator.",
                &["provider"],
            ),
            in_flight: int_gauge(
                r,
                "jobfence_provider_in_flight",
                "Jobs of the provider's queues running with a live lease, from the database on the refresh interval.",
                &["provider"],
            ),
            paused: int_gauge(
                r,
                "jobfence_provider_paused",
                "1 while an operator's pause of the provider is in this mode (all: nothing handed out; sends: reconciles only), else 0.",
                &["provider", "pause"],
            ),
            throttled_seconds,
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    pub(super) fn handout(&self, provider: &str, next_action: &str) {
        self.handouts
            .with_label_values(&[provider, next_action])
            .inc();
    }

    pub(super) fn deferred(&self, provider: &str, cause: Holdback, n: u32) {
        self.deferred
            .with_label_values(&[provider, cause.as_str()])
            .inc_by(u64::from(n));
    }

    pub(super) fn throttle_report(&self, provider: &str) {
        self.throttle_reports.with_label_values(&[provider]).inc();
    }

    pub(super) fn set_units(&self, provider: &str, units: u32, in_flight: Option<u64>) {
        self.units_available
            .with_label_values(&[provider])
            .set(i64::from(units));
        if let Some(n) = in_flight {
            self.in_flight
                .with_label_values(&[provider])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Series that exist from the provider's first sight, at 0, so an
    /// alert's increase() sees the first one.
    fn touch(&self, provider: &str) {
        for action in ["execute", "reconcile"] {
            self.handouts.with_label_values(&[provider, action]);
        }
        for cause in HOLDBACK_CAUSES {
            self.deferred.with_label_values(&[provider, cause.as_str()]);
        }
        self.throttle_reports.with_label_values(&[provider]);
    }

    pub(super) fn set_all(&self, records: &[ProviderRecord]) {
        let mut seen = self.seen.lock().expect("metrics poisoned");
        for r in records {
            if seen.insert(r.name.clone()) {
                self.touch(&r.name);
            }
        }
        for name in seen.iter() {
            let r = records.iter().find(|r| &r.name == name);
            let p = name.as_str();
            self.units_available
                .with_label_values(&[p])
                .set(r.map_or(0, |r| i64::from(r.units_available)));
            self.in_flight
                .with_label_values(&[p])
                .set(r.map_or(0, |r| i64::try_from(r.in_flight).unwrap_or(i64::MAX)));
            for mode in [Pause::All, Pause::Sends] {
                self.paused
                    .with_label_values(&[p, mode.as_str()])
                    .set(i64::from(r.is_some_and(|r| r.pause == mode)));
            }
            let left = r
                .and_then(|r| r.throttled_until.map(|t| (t - r.now).num_milliseconds()))
                .unwrap_or(0)
                .max(0);
            self.throttled_seconds
                .with_label_values(&[p])
                .set(left as f64 / 1000.0);
        }
    }
}
