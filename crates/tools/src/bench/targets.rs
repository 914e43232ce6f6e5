//! The targets of the performance work, measured by one run: each with
//! the value this run measured and whether it met it.

use super::report::{Measured, Phase, Report};

/// Enqueue calls per second through the coordinator at 16 callers before
/// the enqueue pipeline existed (measured on this project's machines; the
/// target is twice this).
const ENQUEUE_BEFORE: f64 = 2_400.0;

/// A target of the performance work and whether this run met it.
pub(super) struct Target {
    pub(super) what: String,
    pub(super) measured: String,
    pub(super) met: Option<bool>,
}

/// A target called `what`: the value measured in `unit` (`None`: its
/// phases did not run), met when `ok` holds for it.
fn target(what: String, value: Option<f64>, unit: &str, ok: impl Fn(f64) -> bool) -> Target {
    Target {
        what,
        measured: value.map_or("not measured".into(), |v| format!("{v:.2}{unit}")),
        met: value.map(ok),
    }
}

/// `a`'s rate over `b`'s, when both ran.
fn ratio(a: Option<&Measured>, b: Option<&Measured>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.rate() / b.rate()),
        _ => None,
    }
}

impl Report<'_> {
    /// The targets of the performance work, in the order they are
    /// printed.
    pub(super) fn targets(&self) -> Vec<Target> {
        let n_max = self.args.workers.iter().copied().max().unwrap_or(64);
        let mut out = self.coordinator_targets(n_max);
        out.extend(self.enqueue_targets());
        out.extend(self.cost_targets(n_max));
        out.extend(self.next_job_targets(n_max));
        out.extend(self.fairness_targets(n_max));
        out.push(self.paced_target());
        out.push(self.workers_view_target(n_max));
        out
    }

    /// The workers view's cost: its bookkeeping for the two calls of a
    /// job that name a worker (a Claim, a Complete asking for the next),
    /// against the coordinator's CPU per job at the most workers.
    fn workers_view_target(&self, n_max: usize) -> Target {
        let per_job_us = self
            .find(Phase::Coordinator, n_max)
            .and_then(|m| m.per_job_us(m.coord_cpu));
        target(
            format!(
                "workers view: noting 2 calls per job ({:.0} ns each) ≤ 3 % of the coordinator's CPU per job at {n_max} workers",
                self.sightings_ns
            ),
            per_job_us.map(|us| 2.0 * self.sightings_ns / 1000.0 / us * 100.0),
            " %",
            |p| p <= 3.0,
        )
    }

    /// The coordinator's lifecycle against the direct SQL: at the most
    /// workers, at one, and its CPU per job.
    fn coordinator_targets(&self, n_max: usize) -> Vec<Target> {
        let coord_max = self.find(Phase::Coordinator, n_max);
        vec![
            target(
                format!("{n_max} workers, max_jobs=1: coordinator ≥ 3× direct"),
                ratio(coord_max, self.find(Phase::Direct, n_max)),
                "×",
                |r| r >= 3.0,
            ),
            target(
                format!(
                    "{n_max} workers, max_jobs=1: coordinator ≥ 50% of the batched direct ceiling"
                ),
                ratio(coord_max, self.ceiling()).map(|r| r * 100.0),
                " %",
                |r| r >= 50.0,
            ),
            target(
                "1 worker: coordinator ≥ 0.8× direct".into(),
                ratio(
                    self.find(Phase::Coordinator, 1),
                    self.find(Phase::Direct, 1),
                ),
                "×",
                |r| r >= 0.8,
            ),
            target(
                format!("coordinator CPU ≤ 150 µs per job at {n_max} workers"),
                coord_max.and_then(|m| m.per_job_us(m.coord_cpu)),
                " µs",
                |us| us <= 150.0,
            ),
        ]
    }

    /// Batched and single enqueue.
    fn enqueue_targets(&self) -> Vec<Target> {
        let medians = self.medians();
        let batch = medians
            .iter()
            .copied()
            .find(|m| matches!(m.phase, Phase::EnqueueBatch(_)));
        let single = medians.iter().copied().find(|m| m.phase == Phase::Enqueue);
        vec![
            target(
                "batched enqueue ≥ 20,000 jobs/s".into(),
                batch.map(Measured::rate),
                " jobs/s",
                |r| r >= 20_000.0,
            ),
            target(
                format!(
                    "single Enqueue at {} callers ≥ 2× before this work ({ENQUEUE_BEFORE:.0}/s)",
                    self.args.enqueue_callers
                ),
                single.map(|m| m.rate() / ENQUEUE_BEFORE),
                "×",
                |r| r >= 2.0,
            ),
        ]
    }

    /// What the coordinator's load costs at the most workers: its memory,
    /// a table full of finished rows, a provider budget far above the
    /// load.
    fn cost_targets(&self, n_max: usize) -> Vec<Target> {
        let coord_max = self.find(Phase::Coordinator, n_max);
        let finished = self
            .medians()
            .into_iter()
            .find(|m| matches!(m.phase, Phase::CoordinatorFinished(_)));
        vec![
            target(
                format!("coordinator peak RSS ≤ 100 MiB at {n_max} workers"),
                coord_max
                    .and_then(|m| m.coord_rss)
                    .map(|b| b as f64 / 1048576.0),
                " MiB",
                |mib| mib <= 100.0,
            ),
            target(
                "with the finished rows loaded, claim throughput ≥ 80% of the empty table".into(),
                ratio(finished, coord_max).map(|r| r * 100.0),
                " %",
                |r| r >= 80.0,
            ),
            target(
                format!(
                    "{n_max} workers under a provider budget far above the load: claim throughput within 10% of no budget"
                ),
                ratio(self.find(Phase::CoordinatorBudget, n_max), coord_max).map(|r| r * 100.0),
                " %",
                |r| r >= 90.0,
            ),
        ]
    }

    /// A budget below the load: the hand-out rate against the configured
    /// one.
    fn paced_target(&self) -> Target {
        let paced = self
            .medians()
            .into_iter()
            .find(|m| matches!(m.phase, Phase::BudgetPaced { .. }));
        let configured = paced.and_then(|m| match m.phase {
            Phase::BudgetPaced { rate_milli, .. } => Some(rate_milli as f64 / 1000.0),
            _ => None,
        });
        target(
            format!(
                "a budget below the load ({}/s): hand-out rate within 5% of it over {} s",
                configured.map_or("–".into(), |r| format!("{r}")),
                self.args.budget_seconds
            ),
            paced
                .zip(configured)
                .map(|(m, r)| (m.rate() - r) / r * 100.0),
            " % off",
            |off| off.abs() <= 5.0,
        )
    }

    /// Issue "one round trip and one transaction per job": the run loop
    /// whose Complete hands out the next job, against the direct SQL.
    fn next_job_targets(&self, n_max: usize) -> Vec<Target> {
        let next_max = self.find(Phase::CoordinatorNext, n_max);
        let worst_db_cpu = self.worst_db_cpu(Phase::CoordinatorNext, Phase::Direct);
        vec![
            target(
                "next job on Complete, 1 worker: ≥ 0.8× direct (stretch 1.0×)".into(),
                ratio(
                    self.find(Phase::CoordinatorNext, 1),
                    self.find(Phase::Direct, 1),
                ),
                "×",
                |r| r >= 0.8,
            ),
            target(
                format!("next job on Complete, {n_max} workers: ≥ 60% of the batched direct ceiling"),
                ratio(next_max, self.ceiling()).map(|r| r * 100.0),
                " %",
                |r| r >= 60.0,
            ),
            target(
                "next job on Complete: database CPU per job ≤ direct's, at every N (worst N's median of the ratios paired by round)".into(),
                worst_db_cpu,
                "×",
                |r| r <= 1.0,
            ),
            target(
                "the same under a budget far above the load: database CPU per job ≤ the direct SQL's under the same budget, at every N".into(),
                self.worst_db_cpu(Phase::CoordinatorNextBudget, Phase::DirectBudget),
                "×",
                |r| r <= 1.0,
            ),
            target(
                "the same under a budget far above the load: database CPU per job ≤ the direct SQL's without one, at every N".into(),
                self.worst_db_cpu(Phase::CoordinatorNextBudget, Phase::Direct),
                "×",
                |r| r <= 1.0,
            ),
            target(
                format!("next job on Complete: coordinator CPU ≤ 100 µs per job at {n_max} workers"),
                next_max.and_then(|m| m.per_job_us(m.coord_cpu)),
                " µs",
                |us| us <= 100.0,
            ),
            target(
                format!(
                    "single Enqueue at {} callers ≥ 0.45× direct inserts",
                    self.args.enqueue_callers
                ),
                ratio(
                    self.medians().into_iter().find(|m| m.phase == Phase::Enqueue),
                    self.medians().into_iter().find(|m| m.phase == Phase::Inserts),
                ),
                "×",
                |r| r >= 0.45,
            ),
            target(
                format!("next job on Complete, {n_max} workers under a budget far above the load: within 10% of no budget"),
                ratio(self.find(Phase::CoordinatorNextBudget, n_max), next_max).map(|r| r * 100.0),
                " %",
                |r| r >= 90.0,
            ),
        ]
    }

    /// Fair hand-out (docs/design.md rule 18): the next-job loop over jobs
    /// with fairness keys against the same without, and one claim's
    /// database work against one key's backlog.
    fn fairness_targets(&self, n_max: usize) -> Vec<Target> {
        let keys = self.args.fairness_keys;
        let backlog = self.backlog.as_ref();
        vec![
            target(
                format!(
                    "next job on Complete, {n_max} workers, jobs across {}: ≥ 90% of the same without keys",
                    super::report::keys(keys)
                ),
                ratio(
                    self.find(Phase::CoordinatorNextKeyed(keys), n_max),
                    self.find(Phase::CoordinatorNext, n_max),
                )
                .map(|r| r * 100.0),
                " %",
                |r| r >= 90.0,
            ),
            target(
                format!(
                    "one claim's handler reads with {} ready jobs of one key ≤ with {}",
                    backlog.map_or(self.args.key_backlog, |b| b.large.ready),
                    backlog.map_or(1_000, |b| b.small.ready)
                ),
                backlog.map(|b| {
                    b.large.handler_reads() as f64 / b.small.handler_reads().max(1) as f64
                }),
                "×",
                |r| r <= 1.0,
            ),
        ]
    }

    /// The keyed next-job loop's rate over the same loop's without keys,
    /// round by round (they ran seconds apart), as a sentence; `None` when
    /// the keyed phase did not run.
    pub(super) fn keyed_rounds(&self) -> Option<String> {
        let n = self.args.workers.iter().copied().max()?;
        let keys = self.args.fairness_keys;
        let runs = |phase: Phase| {
            self.measured
                .iter()
                .filter(move |m| m.phase == phase && m.workers == n)
                .map(Measured::rate)
        };
        let pairs: Vec<String> = runs(Phase::CoordinatorNextKeyed(keys))
            .zip(runs(Phase::CoordinatorNext))
            .map(|(a, b)| format!("{:.2}", a / b))
            .collect();
        (!pairs.is_empty()).then(|| {
            format!(
                "Next job on Complete, {n} workers, jobs across {} × the same \
                 without keys, round by round: {}",
                super::report::keys(keys),
                pairs.join(", ")
            )
        })
    }

    /// The database CPU per job of phase `a` against phase `b`: per N, the
    /// median of the ratios paired by round (see `paired_db_cpu`); the
    /// worst N's.
    fn worst_db_cpu(&self, a: Phase, b: Phase) -> Option<f64> {
        self.args
            .workers
            .iter()
            .filter_map(|&n| {
                let mut pairs = self.paired_db_cpu(a, b, n);
                pairs.sort_by(f64::total_cmp);
                pairs.get(pairs.len() / 2).copied()
            })
            .reduce(f64::max)
    }
}
