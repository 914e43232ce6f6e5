//! The benchmark's table, its ratios and the targets of the performance
//! work, as text for the terminal and as Markdown for `docs/benchmarks.md`.

use super::{BatchCounts, BenchArgs, DbStatus, PhaseRun};
use std::fmt::Write;
use std::time::Duration;

/// What a phase measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    /// Workers running the lifecycle's SQL themselves.
    Direct,
    /// Claim(max_jobs=1) then Complete over gRPC.
    Coordinator,
    /// Claim(max_jobs=K) then the K Completes over gRPC.
    CoordinatorBatching(u32),
    /// The direct lifecycle with this many jobs per transaction.
    Ceiling(u32),
    /// Single-row autocommit inserts, no coordinator.
    Inserts,
    /// The Enqueue RPC.
    Enqueue,
    /// The EnqueueBatch RPC with this many items per call.
    EnqueueBatch(u64),
    /// The coordinator phase with this many finished jobs in the table.
    CoordinatorFinished(u64),
    /// The coordinator phase, its queue under a provider budget far above
    /// the load.
    CoordinatorBudget,
    /// Long-polling workers on the next-job loop against a budget below
    /// the load: jobs/s is the hand-out rate after the burst, by the
    /// database clock.
    BudgetPaced { rate_milli: u64, burst: u32 },
    /// One job at a time, each Complete asking for the next job in the
    /// same call and transaction (docs/design.md rule 16): every client's
    /// run loop.
    CoordinatorNext,
    /// [`CoordinatorNext`](Phase::CoordinatorNext) under a provider budget
    /// far above the load.
    CoordinatorNextBudget,
    /// [`CoordinatorNext`](Phase::CoordinatorNext) over jobs enqueued
    /// round-robin across this many fairness keys (docs/design.md rule 18).
    CoordinatorNextKeyed(u64),
    /// [`CoordinatorNext`](Phase::CoordinatorNext) with the provider
    /// reference's index dropped (`--compare-reference-index`).
    CoordinatorNextNoReferenceIndex,
    /// [`Enqueue`](Phase::Enqueue) with the provider reference's index
    /// dropped (`--compare-reference-index`).
    EnqueueNoReferenceIndex,
    /// [`Direct`](Phase::Direct) under the same budget, kept by the
    /// workers' own SQL (the provider's row locked and spent in each claim
    /// transaction).
    DirectBudget,
}

impl Phase {
    pub fn name(&self) -> String {
        match self {
            Phase::Direct => "direct SQL lifecycle".into(),
            Phase::Coordinator => "coordinator, Claim(1)".into(),
            Phase::CoordinatorBatching(k) => format!("coordinator, Claim({k})"),
            Phase::Ceiling(b) => format!("direct, {b} jobs per transaction (ceiling)"),
            Phase::Inserts => "enqueue: direct single-row inserts".into(),
            Phase::Enqueue => "enqueue: Enqueue RPC".into(),
            Phase::EnqueueBatch(b) => format!("enqueue: EnqueueBatch({b})"),
            Phase::CoordinatorFinished(n) => format!("coordinator, Claim(1), {n} finished rows"),
            Phase::CoordinatorBudget => "coordinator, Claim(1), budget far above the load".into(),
            Phase::CoordinatorNext => "coordinator, Complete hands the next job".into(),
            Phase::CoordinatorNextBudget => {
                "coordinator, Complete hands the next job, budget far above".into()
            }
            Phase::CoordinatorNextKeyed(k) => {
                format!("coordinator, Complete hands the next job, {}", keys(*k))
            }
            Phase::CoordinatorNextNoReferenceIndex => {
                "coordinator, Complete hands the next job, no reference index".into()
            }
            Phase::EnqueueNoReferenceIndex => "enqueue: Enqueue RPC, no reference index".into(),
            Phase::DirectBudget => "direct SQL lifecycle, budget far above the load".into(),
            Phase::BudgetPaced { rate_milli, burst } => format!(
                "budget {}/s (burst {burst}) below the load: hand-outs/s",
                *rate_milli as f64 / 1000.0
            ),
        }
    }

    pub fn uses_coordinator(&self) -> bool {
        matches!(
            self,
            Phase::Coordinator
                | Phase::CoordinatorBatching(_)
                | Phase::Enqueue
                | Phase::EnqueueBatch(_)
                | Phase::CoordinatorFinished(_)
                | Phase::CoordinatorBudget
                | Phase::BudgetPaced { .. }
                | Phase::CoordinatorNext
                | Phase::CoordinatorNextBudget
                | Phase::CoordinatorNextKeyed(_)
                | Phase::CoordinatorNextNoReferenceIndex
                | Phase::EnqueueNoReferenceIndex
        )
    }

    fn is_lifecycle(&self) -> bool {
        !matches!(
            self,
            Phase::Inserts
                | Phase::Enqueue
                | Phase::EnqueueNoReferenceIndex
                | Phase::EnqueueBatch(_)
                | Phase::BudgetPaced { .. }
        )
    }
}

/// One database setting the figures depend on.
#[derive(Debug, Clone)]
pub struct Setting(pub &'static str, pub String);

/// One phase's figures.
#[derive(Debug)]
pub struct Measured {
    pub phase: Phase,
    pub workers: usize,
    pub coord_cpu: Option<Duration>,
    pub coord_rss: Option<u64>,
    pub db_cpu: Option<Duration>,
    /// This process (the workers, or the load generator) over the phase.
    pub load_cpu: Option<Duration>,
    /// What the database server counted during the phase.
    pub status: DbStatus,
    /// The coordinator's batches during the phase.
    pub batches: Option<BatchCounts>,
    pub run: PhaseRun,
}

impl Measured {
    pub fn rate(&self) -> f64 {
        self.run.jobs as f64 / self.run.elapsed.as_secs_f64().max(1e-9)
    }

    pub(super) fn per_job_us(&self, d: Option<Duration>) -> Option<f64> {
        d.map(|d| d.as_secs_f64() * 1e6 / self.run.jobs.max(1) as f64)
    }
}

/// `k` fairness keys, in words.
pub(super) fn keys(k: u64) -> String {
    match k {
        1 => "1 fairness key".into(),
        k => format!("{k} fairness keys"),
    }
}

pub(super) fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_unstable();
    let i = ((s.len() as f64 * p).ceil() as usize).clamp(1, s.len()) - 1;
    Some(s[i])
}

pub(super) fn ms(d: Option<Duration>) -> String {
    d.map_or("–".into(), |d| format!("{:.1}", d.as_secs_f64() * 1000.0))
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// The whole report.
pub struct Report<'a> {
    pub command: String,
    pub machine: String,
    pub settings: Vec<Setting>,
    pub args: &'a BenchArgs,
    pub measured: Vec<Measured>,
    /// The backlog phase, when it ran.
    pub backlog: Option<super::backlog::BacklogFigures>,
    /// The pruning phase, when it ran.
    pub pruning: Option<super::prune::PruneFigures>,
    /// The settlement phase, when it ran.
    pub settlement: Option<super::settle::SettleFigures>,
    /// The bulk repair phase, when it ran.
    pub bulk: Option<super::bulk::BulkFigures>,
    pub elapsed: Duration,
    /// Median round trips on loopback: a gRPC call that does no database
    /// work, and `SELECT 1`.
    pub round_trips: (Duration, Duration),
    /// Nanoseconds the workers view's bookkeeping takes per call that
    /// names a worker (see `sightings.rs`).
    pub sightings_ns: f64,
}

/// One row of the table, as strings.
struct Row {
    cells: Vec<String>,
}

const HEADER: [&str; 17] = [
    "phase",
    "N",
    "jobs",
    "jobs/s",
    "claim p50/p99 ms",
    "complete p50/p99 ms",
    "server mean ms claim/complete",
    "coord CPU µs/job",
    "coord peak RSS MiB",
    "DB CPU µs/job",
    "workers' CPU µs/job",
    "DB stmts/job",
    "fsyncs/job",
    "calls/txn claim·write·enq",
    "× direct",
    "× ceiling",
    "seconds",
];

impl Report<'_> {
    /// The median run (by jobs/s) of each phase and worker count, in the
    /// order the phases first ran.
    pub(super) fn medians(&self) -> Vec<&Measured> {
        let mut keys: Vec<(Phase, usize)> = Vec::new();
        for m in &self.measured {
            if !keys.contains(&(m.phase, m.workers)) {
                keys.push((m.phase, m.workers));
            }
        }
        keys.into_iter()
            .map(|(phase, workers)| {
                let mut runs: Vec<&Measured> = self
                    .measured
                    .iter()
                    .filter(|m| m.phase == phase && m.workers == workers)
                    .collect();
                runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
                runs[runs.len() / 2]
            })
            .collect()
    }

    /// `a`'s database CPU per job over `b`'s, both at `workers`, paired
    /// by repetition (the k-th run of each: they ran seconds apart, round
    /// after round), each pair's ratio in run order; empty when either
    /// phase did not run or the database's CPU was not read. On a shared
    /// machine whose speed drifts between rounds, a ratio within one round
    /// is steadier than one between the two phases' median rounds.
    pub(super) fn paired_db_cpu(&self, a: Phase, b: Phase, workers: usize) -> Vec<f64> {
        let runs = |phase: Phase| {
            self.measured
                .iter()
                .filter(move |m| m.phase == phase && m.workers == workers)
        };
        runs(a)
            .zip(runs(b))
            .filter_map(|(a, b)| Some(a.per_job_us(a.db_cpu)? / b.per_job_us(b.db_cpu)?))
            .collect()
    }

    pub(super) fn find(&self, phase: Phase, workers: usize) -> Option<&Measured> {
        self.medians()
            .into_iter()
            .find(|m| m.phase == phase && m.workers == workers)
    }

    pub(super) fn ceiling(&self) -> Option<&Measured> {
        self.medians()
            .into_iter()
            .find(|m| matches!(m.phase, Phase::Ceiling(_)))
    }

    fn runs(&self, phase: Phase, workers: usize) -> Vec<f64> {
        self.measured
            .iter()
            .filter(|m| m.phase == phase && m.workers == workers)
            .map(Measured::rate)
            .collect()
    }

    /// The rate the *× direct* column compares `m` with, if any.
    fn direct_rate(&self, m: &Measured) -> Option<f64> {
        match m.phase {
            Phase::Coordinator
            | Phase::CoordinatorBatching(_)
            | Phase::CoordinatorNext
            | Phase::CoordinatorNextNoReferenceIndex
            | Phase::CoordinatorNextKeyed(_) => {
                self.find(Phase::Direct, m.workers).map(Measured::rate)
            }
            // Under the budget: against the direct SQL keeping the same
            // budget.
            Phase::CoordinatorBudget | Phase::CoordinatorNextBudget => self
                .find(Phase::DirectBudget, m.workers)
                .or_else(|| self.find(Phase::Direct, m.workers))
                .map(Measured::rate),
            Phase::Enqueue | Phase::EnqueueNoReferenceIndex | Phase::EnqueueBatch(_) => self
                .medians()
                .into_iter()
                .find(|x| x.phase == Phase::Inserts)
                .map(Measured::rate),
            _ => None,
        }
    }

    fn rows(&self) -> Vec<Row> {
        let ceiling = self.ceiling().map(Measured::rate);
        self.medians()
            .into_iter()
            .map(|m| {
                let direct = self.direct_rate(m);
                let lat = &m.run.latencies;
                Row {
                    cells: vec![
                        m.phase.name(),
                        m.workers.to_string(),
                        m.run.jobs.to_string(),
                        {
                            let runs = self.runs(m.phase, m.workers);
                            if runs.len() > 1 {
                                let lo = runs.iter().copied().fold(f64::MAX, f64::min);
                                let hi = runs.iter().copied().fold(0.0, f64::max);
                                format!("{:.0} ({lo:.0}–{hi:.0})", m.rate())
                            } else {
                                format!("{:.0}", m.rate())
                            }
                        },
                        format!(
                            "{} / {}",
                            ms(percentile(&lat.claim, 0.5)),
                            ms(percentile(&lat.claim, 0.99))
                        ),
                        format!(
                            "{} / {}",
                            ms(percentile(&lat.complete, 0.5)),
                            ms(percentile(&lat.complete, 0.99))
                        ),
                        m.batches.map_or("–".into(), |b| {
                            format!("{} / {}", ms(b.server_mean(0)), ms(b.server_mean(1)))
                        }),
                        opt(m.per_job_us(m.coord_cpu), 0),
                        opt(m.coord_rss.map(|b| b as f64 / 1048576.0), 1),
                        opt(m.per_job_us(m.db_cpu), 0),
                        opt(m.per_job_us(m.load_cpu), 0),
                        format!(
                            "{:.1}",
                            m.status.statements as f64 / m.run.jobs.max(1) as f64
                        ),
                        format!("{:.2}", m.status.fsyncs as f64 / m.run.jobs.max(1) as f64),
                        m.batches.map_or("–".into(), |b| {
                            BatchCounts::PIPELINES
                                .iter()
                                .map(|p| opt(b.mean(p), 1))
                                .collect::<Vec<_>>()
                                .join(" · ")
                        }),
                        opt(direct.map(|d| m.rate() / d), 2),
                        opt(
                            ceiling
                                .filter(|_| m.phase.is_lifecycle())
                                .map(|c| m.rate() / c),
                            2,
                        ),
                        format!("{:.2}", m.run.elapsed.as_secs_f64()),
                    ],
                }
            })
            .collect()
    }

    /// The table and the targets, for the terminal.
    pub fn text(&self) -> String {
        let rows = self.rows();
        let mut widths: Vec<usize> = HEADER.iter().map(|h| h.chars().count()).collect();
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(&r.cells) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                let pad = w - c.chars().count();
                if i == 0 {
                    let _ = write!(out, "{c}{}  ", " ".repeat(pad));
                } else {
                    let _ = write!(out, "{}{c}  ", " ".repeat(pad));
                }
            }
            out.push('\n');
        };
        line(&HEADER.map(String::from), &mut out);
        for r in &rows {
            line(&r.cells, &mut out);
        }
        out.push('\n');
        for t in self.targets() {
            let verdict = match t.met {
                Some(true) => "met   ",
                Some(false) => "MISSED",
                None => "–     ",
            };
            let _ = writeln!(out, "{verdict} {}: {}", t.what, t.measured);
        }
        if let Some(r) = self.reference_index_rounds() {
            let _ = writeln!(out, "\n{r}");
        }
        if let Some(b) = &self.backlog {
            out.push('\n');
            out.push_str(&b.markdown());
        }
        if let Some(p) = &self.pruning {
            out.push('\n');
            out.push_str(&p.markdown());
        }
        if let Some(s) = &self.settlement {
            out.push('\n');
            out.push_str(&s.markdown());
        }
        if let Some(b) = &self.bulk {
            out.push('\n');
            out.push_str(&b.markdown());
        }
        out
    }

    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        self.markdown_setup(&mut out);
        let _ = writeln!(out, "| {} |", HEADER.join(" | "));
        let _ = writeln!(out, "|{}|", vec!["---"; HEADER.len()].join("|"));
        for r in self.rows() {
            let _ = writeln!(out, "| {} |", r.cells.join(" | "));
        }
        let _ = writeln!(
            out,
            "\nColumns: *N* is workers (enqueue: callers); latencies are per call as the caller saw \
             it (for enqueue phases the call), and *server mean* as the coordinator measured \
             it (from its `jobfence_rpc_duration_seconds`); CPU is per job over the phase (coordinator process; \
             database server process when it runs on this machine; *workers' CPU* is the \
             benchmark's own process, which runs the direct workers' SQL or the gRPC load \
             generator); *DB stmts/job* and \
             *fsyncs/job* are the server's `Questions` and `Innodb_data_fsyncs` over the \
             phase per job; *calls/txn* is the mean number of calls per transaction of the \
             coordinator's claim, write and enqueue pipelines; *× direct* compares with the \
             direct lifecycle at the same N (phases under the budget far above the load: with \
             the direct lifecycle under the same budget; enqueue phases: with direct \
             single-row inserts); \
             *× ceiling* with the batched direct ceiling.\n"
        );
        self.markdown_targets(&mut out);
        if let Some(b) = &self.backlog {
            out.push('\n');
            out.push_str(&b.markdown());
        }
        if let Some(p) = &self.pruning {
            out.push('\n');
            out.push_str(&p.markdown());
        }
        if let Some(s) = &self.settlement {
            out.push('\n');
            out.push_str(&s.markdown());
        }
        if let Some(b) = &self.bulk {
            out.push('\n');
            out.push_str(&b.markdown());
        }
        out
    }

    /// The title, how the figures were made, and the setup: the command,
    /// the machine, the database settings, the coordinator, the round
    /// trips.
    fn markdown_setup(&self, out: &mut String) {
        let _ = writeln!(out, "# Benchmarks\n");
        let _ = writeln!(
            out,
            "Written by `jobfence bench` (run it with `scripts/bench`); every figure below is from one run, \
             all phases side by side against the same database, each phase repeated {} times \
             interleaved with the phases it is compared with; a row is the median repetition \
             (jobs/s shows the range of all). After each lifecycle phase the \
             benchmark checked that every job succeeded exactly once with exactly one completion \
             event. It is a benchmark, not a test: nothing asserts on these numbers, and on a \
             shared 2-core machine they move by 10–20 % from run to run (the database server's CPU \
             per job is the steadier figure).\n",
            self.args.repeat.max(1)
        );
        let _ = writeln!(out, "- command: `{}`", self.command);
        let _ = writeln!(out, "- machine: {}", self.machine);
        for Setting(k, v) in &self.settings {
            let _ = writeln!(out, "- {k}: {v}");
        }
        let _ = writeln!(
            out,
            "- the coordinator is `jobfence serve` (this binary) as its own process, defaults but \
             `--db-max-connections 32` and `--insecure` (cleartext HTTP/2, no authentication, \
             like the direct SQL it is compared with: TLS costs a handshake per connection, and \
             the callers check one SHA-256 and a map lookup per call); the load generator runs \
             in the benchmark's process, one HTTP/2 connection per worker, on loopback"
        );
        let _ = writeln!(
            out,
            "- round trips on loopback (median of 500): a gRPC call that does no database work \
             {:.0} µs; `SELECT 1` {:.0} µs",
            self.round_trips.0.as_secs_f64() * 1e6,
            self.round_trips.1.as_secs_f64() * 1e6
        );
        let _ = writeln!(out, "- whole run: {:.0} s\n", self.elapsed.as_secs_f64());
    }

    /// The targets as a table, and where the misses are explained.
    fn markdown_targets(&self, out: &mut String) {
        let _ = writeln!(out, "## Targets\n");
        let _ = writeln!(out, "| target | this run | met |");
        let _ = writeln!(out, "|---|---|---|");
        for t in self.targets() {
            let met = match t.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "not run",
            };
            let _ = writeln!(out, "| {} | {} | {met} |", t.what, t.measured);
        }
        let compared = [
            (Phase::CoordinatorNext, Phase::Direct, ""),
            (
                Phase::CoordinatorNextBudget,
                Phase::DirectBudget,
                ", both under the budget far above the load",
            ),
        ];
        for (a, b, which) in compared {
            for &n in &self.args.workers {
                let pairs = self.paired_db_cpu(a, b, n);
                if !pairs.is_empty() {
                    let list: Vec<String> = pairs.iter().map(|r| format!("{r:.2}")).collect();
                    let _ = writeln!(
                        out,
                        "\nNext job on Complete, {n} workers: database CPU per job × direct's{which}, \
                         round by round: {}",
                        list.join(", ")
                    );
                }
            }
        }
        if let Some(keyed) = self.keyed_rounds() {
            let _ = writeln!(out, "\n{keyed}");
        }
        if let Some(r) = self.reference_index_rounds() {
            let _ = writeln!(out, "\n{r}");
        }
        let _ = writeln!(
            out,
            "\nA worker killed while holding a job is picked up by a long-polling worker within its \
             lease plus the wake-up delay: `tests/in_process/long_poll.rs` measures and prints that delay. \
             The finished-rows phase starts once InnoDB has written back the pages the load \
             dirtied (the wait is printed). Why the targets marked **no** are missed, what each \
             mechanism changed (runs with one of them turned off) and what was left alone: \
             `docs/architecture.md`, \"What each mechanism changed\" and \"Limits\"."
        );
    }
}
