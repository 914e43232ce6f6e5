//! Paced background work's metrics (`jobfence_domain::pacing`;
//! docs/operating.md, "Settlement"): how long each kind of work rested,
//! and why, and what it last found of the workers.

use jobfence_domain::pacing::{Pace, Rest, RestKind};
use prometheus::{CounterVec, GaugeVec, IntGaugeVec, Opts, Registry};

/// The `work` label values: the kinds of paced background work (the
/// pruner rests a fixed multiple of each batch instead, `--prune-rest`,
/// which keeps the workers above 85 % already: docs/benchmarks.md).
pub const PACED_WORK: [&str; 1] = ["settlement_import"];

pub(super) struct PacingMetrics {
    rest: CounterVec,
    slower: GaugeVec,
    yielding: IntGaugeVec,
}

impl PacingMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let rest = CounterVec::new(
            Opts::new(
                "jobfence_background_rest_seconds_total",
                "Seconds this coordinator's paced background work (work: settlement_import) rested between its batches, by why: yield (leaving the database to the workers, whose jobs a batch slowed by more than the 15 % allowed) or probe (measuring the workers' rate without the work).",
            ),
            &["work", "why"],
        )
        .expect("valid counter");
        let slower = GaugeVec::new(
            Opts::new(
                "jobfence_background_workers_slower_ratio",
                "How much slower the workers' jobs (job events, any coordinator of the database) ran while a batch of this work ran than while it rested, as last measured, the most of any run going (0 to 1; 0 when nothing else runs or the work is not running).",
            ),
            &["work"],
        )
        .expect("valid gauge");
        let yielding = IntGaugeVec::new(
            Opts::new(
                "jobfence_background_yielding",
                "1 while this background work (any run of it) rests after each batch to leave the database to the workers, 0 while it runs flat out or not at all.",
            ),
            &["work"],
        )
        .expect("valid gauge");
        r.register(Box::new(rest.clone()))
            .expect("unique metric name");
        r.register(Box::new(slower.clone()))
            .expect("unique metric name");
        r.register(Box::new(yielding.clone()))
            .expect("unique metric name");
        for work in PACED_WORK {
            for why in ["yield", "probe"] {
                rest.with_label_values(&[work, why]);
            }
            slower.with_label_values(&[work]);
            yielding.with_label_values(&[work]);
        }
        PacingMetrics {
            rest,
            slower,
            yielding,
        }
    }
}

impl super::Metrics {
    /// Records one rest of paced `work` (one of [`PACED_WORK`]) after a
    /// batch: its seconds, by why it rested.
    pub fn rested(&self, work: &str, rest: &Rest) {
        let why = match rest.kind {
            RestKind::None => return,
            RestKind::Probe => "probe",
            RestKind::Yield => "yield",
        };
        self.inner
            .pacing
            .rest
            .with_label_values(&[work, why])
            .inc_by(rest.seconds.max(0.0));
    }

    /// Sets `work`'s gauges from the paces of every run of it this
    /// coordinator has going (two imports at once each have their own):
    /// yielding while any one yields, and the most any one found the
    /// workers slowed; both 0 with none.
    pub fn paced<'a>(&self, work: &str, paces: impl IntoIterator<Item = &'a Pace>) {
        let (mut yielding, mut slower) = (false, 0.0f64);
        for pace in paces {
            yielding |= pace.yielding();
            slower = slower.max(pace.slower());
        }
        let m = &self.inner.pacing;
        m.slower.with_label_values(&[work]).set(slower);
        m.yielding
            .with_label_values(&[work])
            .set(i64::from(yielding));
    }
}
