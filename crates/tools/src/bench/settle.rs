//! The settlement phase of `jobfence bench` (docs/design.md rule 15):
//! `--settle-lines` finished jobs of a provider's queue, and a report of
//! as many refunds (one per job, CSV), imported with `jobfence settlement
//! import` through the coordinator while N gRPC workers run the lifecycle
//! on another queue (every client's loop: each Complete asks for the next
//! job); against the same lifecycle rounds with nothing
//! imported. Reported: lines imported per second, claim throughput and
//! p50/p99 of both sides, and the coordinator's peak memory during the
//! import (its VmHWM, reset just before). Then the same import once more
//! with no workers, its lines deleted first: its rate alone, and the CPU
//! each process spends per line (the database server, the coordinator,
//! the command), which says where a line's cost is. The import paces
//! itself (`jobfence_domain::pacing`); with no `--settle-max-rate` nothing
//! is set, and the report shows side by side the workers alone, the import
//! beside them (how long it took, how long it yielded, what the workers
//! kept) and the import alone.

use super::db::{load_finished, settle};
use super::procstat;
use super::prune::{round as round_on_queue, Loop, Side};
use anyhow::{ensure, Context, Result};
use jobfence_api::v1 as proto;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use sqlx::mysql::MySqlPool;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The provider the phase settles, and the queue its loaded jobs are in
/// (`load_finished` puts them in `archive`).
const PROVIDER: &str = "bench-psp";
const SETTLED_QUEUE: &str = "archive";

/// What the phase loads and runs.
pub struct Load {
    /// Jobs loaded, and report lines imported.
    pub lines: u64,
    /// The import's `--max-rate` (0: flat out).
    pub max_rate: u32,
    pub workers: usize,
    /// Jobs per lifecycle round.
    pub jobs: u64,
    /// Rounds of the side with nothing imported.
    pub rounds: usize,
    /// The `jobfence` binary (its `settlement import` is what is timed).
    pub bin: PathBuf,
    pub log_dir: PathBuf,
    pub coordinator_pid: u32,
    /// The database server's process, when it runs on this machine.
    pub db_pid: Option<u32>,
    /// The longest wait for InnoDB to write back and purge what the load
    /// (and the first import's lines, deleted) left (`--settle-seconds`).
    pub settle: Duration,
}

impl Load {
    /// The phase as the flags say.
    pub fn of(
        args: &super::BenchArgs,
        workers: usize,
        coordinator_pid: u32,
        db_pid: Option<u32>,
    ) -> Result<Load> {
        Ok(Load {
            lines: args.settle_lines,
            max_rate: args.settle_max_rate,
            workers,
            jobs: args.jobs,
            rounds: args.prune_rounds,
            bin: std::env::current_exe()?,
            log_dir: args.log_dir.clone(),
            coordinator_pid,
            db_pid,
            settle: Duration::from_secs(args.settle_seconds),
        })
    }
}

/// What the phase measured.
#[derive(Debug)]
pub struct SettleFigures {
    pub lines: u64,
    pub max_rate: u32,
    pub workers: usize,
    pub import: Duration,
    pub without: Side,
    pub during: Side,
    /// The coordinator's peak resident memory during the import, and just
    /// before it.
    pub peak_rss: Option<u64>,
    pub rss_before: Option<u64>,
    /// The same import with no workers, afterwards.
    pub alone: Alone,
    /// How the import beside the workers was paced: how long it rested to
    /// yield to them (seconds), and what its pacing found last.
    pub yielded: f64,
    pub pace: String,
}

/// An import with nothing else running: how long it took, and the CPU
/// per line of each process (`None` where it could not be read: a
/// database on another machine).
#[derive(Debug)]
pub struct Alone {
    pub import: Duration,
    /// How long it rested to yield (seconds): nothing else ran, so 0.
    pub yielded: f64,
    pub db: Option<Duration>,
    pub coordinator: Option<Duration>,
    pub command: Option<Duration>,
}

/// Runs the phase.
pub async fn run(pool: &MySqlPool, addr: &str, load: Load) -> Result<SettleFigures> {
    load_finished(pool, load.lines, 2).await?;
    settle(pool, load.settle).await?;
    configure(addr).await?;
    let report = load.log_dir.join("settlement-report.csv");
    write_report(&report, load.lines)?;
    let mut without = Side::default();
    for _ in 0..load.rounds.max(1) {
        without.add(round_on_queue(pool, addr, load.workers, load.jobs, Loop::NextJob).await?);
    }
    eprintln!(
        "bench: {:<44} {:>8.0} jobs/s",
        format!("lifecycle, nothing imported N={}", load.workers),
        without.rate()
    );
    let rss_before = procstat::peak_rss(load.coordinator_pid);
    procstat::reset_peak_rss(load.coordinator_pid);
    let started = Instant::now();
    let importing = tokio::spawn(import(
        load.bin.clone(),
        addr.to_owned(),
        report.clone(),
        load.max_rate,
    ));
    let mut during = Side::default();
    while !importing.is_finished() || during.rounds == 0 {
        during.add(round_on_queue(pool, addr, load.workers, load.jobs, Loop::NextJob).await?);
    }
    let summary = importing.await??;
    let import = started.elapsed();
    let peak_rss = procstat::peak_rss(load.coordinator_pid);
    ensure!(
        summary["lines_new"].as_u64() == Some(load.lines)
            && summary["matched"].as_u64() == Some(load.lines),
        "the import did not match every line: {summary}"
    );
    let alone = import_alone(pool, addr, &load, &report).await?;
    let (yielded, pace) = paced(&summary);
    let figures = SettleFigures {
        lines: load.lines,
        max_rate: load.max_rate,
        workers: load.workers,
        import,
        without,
        during,
        peak_rss,
        rss_before,
        alone,
        yielded,
        pace,
    };
    eprintln!(
        "bench: {:<44} {:>8.0} jobs/s, {:.0} % ({} lines imported in {:.1} s: {:.0} lines/s; \
         yielded {:.1} s; at the end {})",
        format!("lifecycle while importing N={}", load.workers),
        figures.during.rate(),
        figures.ratio() * 100.0,
        load.lines,
        import.as_secs_f64(),
        figures.lines_per_second(),
        figures.yielded,
        figures.pace,
    );
    Ok(figures)
}

/// How an import was paced, from its summary: seconds yielded, and what
/// its pacing found last.
fn paced(summary: &serde_json::Value) -> (f64, String) {
    let pace = &summary["pace"];
    (
        pace["yielded_seconds"].as_f64().unwrap_or(0.0),
        pace["summary"].as_str().unwrap_or("?").to_owned(),
    )
}

/// The import once more with no workers running, after the lines (and
/// any exception) of the first are deleted, so it does the same work:
/// its duration, and the CPU per line of the database server, the
/// coordinator and the command (the command's from the CPU of this
/// process's waited-for children, which it alone adds to meanwhile).
async fn import_alone(pool: &MySqlPool, addr: &str, load: &Load, report: &Path) -> Result<Alone> {
    for table in [
        "TRUNCATE TABLE settlement_lines",
        "DELETE FROM settlement_exception_actions",
        "DELETE FROM settlement_exceptions",
    ] {
        sqlx::query(table).execute(pool).await?;
    }
    // Nothing else's background writes in the database's CPU per line:
    // the first import's, the workers' and the deletes'.
    settle(pool, load.settle).await?;
    let children = procstat::children_cpu;
    let before = (
        load.db_pid.and_then(procstat::cpu_time),
        procstat::cpu_time(load.coordinator_pid),
        children(),
    );
    let started = Instant::now();
    let summary = import(load.bin.clone(), addr.to_owned(), report.to_owned(), 0).await?;
    let took = started.elapsed();
    let after = (
        load.db_pid.and_then(procstat::cpu_time),
        procstat::cpu_time(load.coordinator_pid),
        children(),
    );
    ensure!(
        summary["lines_new"].as_u64() == Some(load.lines)
            && summary["matched"].as_u64() == Some(load.lines),
        "the import alone did not match every line: {summary}"
    );
    let per_line = |b: Option<Duration>, a: Option<Duration>| {
        Some(a?.checked_sub(b?)? / u32::try_from(load.lines.max(1)).unwrap_or(u32::MAX))
    };
    let alone = Alone {
        import: took,
        yielded: paced(&summary).0,
        db: per_line(before.0, after.0),
        coordinator: per_line(before.1, after.1),
        command: per_line(before.2, after.2),
    };
    eprintln!(
        "bench: {:<44} {:>8.0} lines/s (yielded {:.1} s); per line: database {}, coordinator {}, command {}",
        "settlement import alone",
        load.lines as f64 / took.as_secs_f64().max(1e-9),
        alone.yielded,
        micros(alone.db),
        micros(alone.coordinator),
        micros(alone.command),
    );
    Ok(alone)
}

/// A per-line CPU time in µs, or `?`.
fn micros(d: Option<Duration>) -> String {
    d.map_or("?".into(), |d| format!("{:.1} µs", d.as_secs_f64() * 1e6))
}

/// The provider over the loaded jobs' queue, its budget far above any
/// load, read with the fake provider's preset, no lag.
async fn configure(addr: &str) -> Result<()> {
    let mut admin = JobAdminClient::connect(format!("http://{addr}")).await?;
    admin
        .put_provider(proto::PutProviderRequest {
            name: PROVIDER.into(),
            budget: Some(proto::ProviderBudget {
                rate_per_second: 1_000_000.0,
                burst: 1_000_000,
                ..Default::default()
            }),
            queues: vec![SETTLED_QUEUE.into()],
            operator: "bench".into(),
            reason: "the settlement phase".into(),
        })
        .await
        .map_err(|s| anyhow::anyhow!(jobfence_operator::describe_status(&s)))?;
    admin
        .put_settlement_settings(proto::PutSettlementSettingsRequest {
            provider: PROVIDER.into(),
            preset: "fake".into(),
            lag: Some(prost_types::Duration::default()),
            queues: vec![proto::QueueAmountPointers {
                queue: SETTLED_QUEUE.into(),
                amount_pointer: "/amount".into(),
                currency_pointer: String::new(),
            }],
            operator: "bench".into(),
            reason: "the settlement phase".into(),
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow::anyhow!(jobfence_operator::describe_status(&s)))?;
    Ok(())
}

/// One settled refund per loaded job (`done-N`), in the fake provider's
/// columns.
fn write_report(path: &Path, lines: u64) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "id,merchant_reference,amount,currency,status,created")?;
    for k in 0..lines {
        writeln!(out, "re_{k:08},done-{k},1,USD,succeeded,1764547200")?;
    }
    out.flush()?;
    Ok(())
}

/// `jobfence settlement import` of the report; its JSON summary.
async fn import(
    bin: PathBuf,
    addr: String,
    report: PathBuf,
    max_rate: u32,
) -> Result<serde_json::Value> {
    let out = tokio::process::Command::new(bin)
        .args([
            "settlement",
            "import",
            "--provider",
            PROVIDER,
            "--json",
            "--operator",
            "bench",
        ])
        .args([
            "--from",
            "2000-01-01",
            "--to",
            &chrono::Utc::now().to_rfc3339(),
            "--endpoint",
            &addr,
            "--max-rate",
            &max_rate.to_string(),
        ])
        .arg(&report)
        .env_remove("JOBFENCE_TOKEN_FILE")
        .env_remove("JOBFENCE_TLS_CA")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running jobfence settlement import")?;
    ensure!(
        out.status.success(),
        "jobfence settlement import failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("reading the import's summary")
}

fn mib(b: Option<u64>) -> String {
    b.map_or("?".into(), |b| {
        format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
    })
}

impl SettleFigures {
    /// Report lines imported per second.
    pub fn lines_per_second(&self) -> f64 {
        self.lines as f64 / self.import.as_secs_f64().max(1e-9)
    }

    /// Claim throughput during the import as a share of without it.
    pub fn ratio(&self) -> f64 {
        self.during.rate() / self.without.rate().max(1e-9)
    }

    /// The import alone's lines a second.
    pub fn alone_lines_per_second(&self) -> f64 {
        self.lines as f64 / self.alone.import.as_secs_f64().max(1e-9)
    }

    /// The section, as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Settlement import\n");
        let _ = writeln!(
            out,
            "{} finished jobs of a provider's queue, and the provider's report of as many \
             settled refunds (CSV, the fake provider's columns), imported with `jobfence \
             settlement import` ({}; streamed in batches of 2000 lines, each batch one short \
             transaction for the lines and the reads and locks of their keys; the import paces \
             itself by the workers' job events) while {} gRPC workers run every client's loop \
             (each Complete asks for the next job) on another queue; against the same rounds \
             with nothing imported, and the same import afterwards with no workers (its lines \
             deleted first). Every line matched. The coordinator's peak memory during the \
             import: {} (before it: {}).\n",
            self.lines,
            match self.max_rate {
                0 => "no option set".to_string(),
                r => format!("`--max-rate {r}`"),
            },
            self.workers,
            mib(self.peak_rss),
            mib(self.rss_before),
        );
        let _ = writeln!(
            out,
            "| | import took | lines/s | yielded | claims (jobs/s) | claims kept |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        let _ = writeln!(
            out,
            "| the workers alone | – | – | – | {:.0} | 100 % |",
            self.without.rate()
        );
        let _ = writeln!(
            out,
            "| the import beside them | {:.1} s | **{:.0}** | {:.1} s | {:.0} | **{:.0} %** |",
            self.import.as_secs_f64(),
            self.lines_per_second(),
            self.yielded,
            self.during.rate(),
            self.ratio() * 100.0
        );
        let _ = writeln!(
            out,
            "| the import alone | {:.1} s | **{:.0}** | {:.1} s | – | – |",
            self.alone.import.as_secs_f64(),
            self.alone_lines_per_second(),
            self.alone.yielded,
        );
        let _ = writeln!(
            out,
            "\nClaims while importing: **{:.0} %** of their rate without (target 85 %); the \
             import's pacing at its end: {}.\n",
            self.ratio() * 100.0,
            self.pace
        );
        Side::table(
            &mut out,
            [
                ("nothing imported", &self.without),
                ("while importing", &self.during),
            ],
        );
        let a = &self.alone;
        let _ = writeln!(
            out,
            "\nThe import alone, CPU per line: the database server {}, the coordinator {}, the \
             command {}.\n",
            micros(a.db),
            micros(a.coordinator),
            micros(a.command),
        );
        out
    }
}
