//! The backlog phase of `jobfence bench` (docs/design.md rule 18): one
//! fairness key's backlog must not make a claim's database work grow. The
//! same claim (`JobStore::claim_batch`, one job, what the coordinator's
//! claim pipeline sends for a lone Claim) with 1,000 ready jobs of one key,
//! then with `--key-backlog` of them, its database work read from the
//! server's counters before and after it: the handler reads
//! (`Handler_read%`), the rows read (MariaDB's `Rows_read`, MySQL's
//! `Innodb_rows_read`) and the statements (`Questions`).
//!
//! The store runs a claim on its own sessions (the transactions of its
//! batch pool, which a caller cannot reach), so the counters read are the
//! server's global ones. A window in which any other client sent a
//! statement (the benchmark's coordinator checking its schema, another
//! database's users on a shared server) counts more `Questions` than the
//! claim's own, and is left out; of the windows kept, the median less the
//! median of empty windows (what reading the counters itself counts).

use super::db::fill_keyed;
use super::BenchArgs;
use anyhow::{ensure, Result};
use jobfence_domain::{ClaimSlot, QueuePolicy};
use jobfence_store::{self as store, JobStore, PoolSettings};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::Row;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// The phase's queue, and the one fairness key of its jobs.
const QUEUE: &str = "bench-backlog";
const KEY: &str = "bulk-merchant";
/// The smaller backlog.
const SMALL: u64 = 1_000;
/// Clean windows wanted of each kind (a claim, nothing), and the most
/// rounds tried for them.
const WANTED: usize = 15;
const MOST_ROUNDS: usize = 300;

/// The server's counters read in one window, by name.
type Counters = BTreeMap<String, i64>;

/// One claim's database work with `ready` jobs of one key ready.
#[derive(Debug, Clone)]
pub struct ClaimWork {
    /// Ready jobs of the key when the claims began.
    pub ready: u64,
    /// Per claim: each `Handler_read…` counter that moved, by its name
    /// without the prefix (`key`, `next`, …).
    pub handler: BTreeMap<String, i64>,
    /// Per claim: rows read (`Rows_read`, or MySQL's `Innodb_rows_read`).
    pub rows_read: i64,
    /// Per claim: statements the claim's session sent.
    pub statements: i64,
    /// Claim windows kept, of those read.
    pub kept: (usize, usize),
}

impl ClaimWork {
    /// Handler reads per claim, all counters together.
    pub fn handler_reads(&self) -> i64 {
        self.handler.values().sum()
    }
}

/// What the phase measured.
#[derive(Debug)]
pub struct BacklogFigures {
    /// With 1,000 ready jobs of the key.
    pub small: ClaimWork,
    /// With `--key-backlog` of them.
    pub large: ClaimWork,
    /// How long enqueueing the larger backlog took.
    pub fill: Duration,
}

/// Runs the phase on an emptied database.
pub(super) async fn run(pool: &MySqlPool, args: &BenchArgs) -> Result<BacklogFigures> {
    let one = PoolSettings {
        max_connections: 1,
        ..PoolSettings::default()
    };
    let claims = JobStore::new(store::connect(&args.database_url, &one)?);
    let mut status = pool.acquire().await?;
    let key = |_| Some(KEY.to_owned());
    fill_keyed(pool, QUEUE, 0..SMALL, key).await?;
    let small = measure(&claims, &mut status, pool).await?;
    // Topped up to exactly --key-backlog ready.
    let more = args.key_backlog.saturating_sub(ready(pool).await?);
    let started = Instant::now();
    fill_keyed(pool, QUEUE, SMALL..SMALL + more, key).await?;
    let fill = started.elapsed();
    let large = measure(&claims, &mut status, pool).await?;
    claims.pool().close().await;
    for w in [&small, &large] {
        eprintln!(
            "bench: {:<44} {:>8} handler reads, {} rows read, {} statements per claim \
             ({} of {} windows kept; checked: each claim took the key's oldest job)",
            format!("one claim, {} ready jobs of one key", w.ready),
            w.handler_reads(),
            w.rows_read,
            w.statements,
            w.kept.0,
            w.kept.1
        );
    }
    Ok(BacklogFigures { small, large, fill })
}

/// One claim's work, as the module says: claims (three first, unmeasured,
/// so the session's statements are prepared) and empty windows in turn
/// until enough of each are clean.
async fn measure(
    claims: &JobStore,
    status: &mut MySqlConnection,
    pool: &MySqlPool,
) -> Result<ClaimWork> {
    let ready = ready(pool).await?;
    let mut last = 0;
    for _ in 0..3 {
        last = claim(claims, last).await?;
    }
    let (mut taken, mut empty) = (Vec::new(), Vec::new());
    for _ in 0..MOST_ROUNDS {
        if kept(&taken).len() >= WANTED && kept(&empty).len() >= WANTED {
            break;
        }
        let before = counters(status).await?;
        empty.push(since(&counters(status).await?, &before));
        let before = counters(status).await?;
        last = claim(claims, last).await?;
        taken.push(since(&counters(status).await?, &before));
    }
    let (clean, base) = (kept(&taken), kept(&empty));
    ensure!(
        !clean.is_empty() && !base.is_empty(),
        "no window without other clients' statements in {MOST_ROUNDS} rounds"
    );
    let per_claim = |name: &str| median(&clean, name) - median(&base, name);
    let handler: BTreeMap<String, i64> = clean[0]
        .keys()
        .filter_map(|k| Some((k.strip_prefix("Handler_read_")?, per_claim(k))))
        .filter(|(_, v)| *v != 0)
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    Ok(ClaimWork {
        ready,
        handler,
        rows_read: per_claim("Rows_read") + per_claim("Innodb_rows_read"),
        statements: per_claim("Questions"),
        kept: (clean.len(), taken.len()),
    })
}

/// The phase's ready jobs.
async fn ready(pool: &MySqlPool) -> Result<u64> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM jobs WHERE queue = ? AND state = 'ready'")
            .bind(QUEUE)
            .fetch_one(pool)
            .await?;
    Ok(n.max(0) as u64)
}

/// One claim of one job; fails unless it took a job after `last` (the
/// key's jobs leave in the order they came).
async fn claim(store: &JobStore, last: u64) -> Result<u64> {
    let slot = ClaimSlot {
        worker_id: "bench-backlog".into(),
        max_jobs: 1,
        lease: Duration::from_secs(600),
        waiter: None,
    };
    let out = store
        .claim_batch(QUEUE, QueuePolicy::default(), &[slot], false)
        .await?;
    let job = out.jobs.into_iter().flatten().next();
    let Some(job) = job else {
        anyhow::bail!("a claim found no ready job of the backlog");
    };
    ensure!(
        job.job.id > last,
        "a claim took job {} after job {last}: not the key's oldest",
        job.job.id
    );
    Ok(job.job.id)
}

/// The server's handler-read counters, the rows read and the statements
/// sent, as one statement reads them.
async fn counters(conn: &mut MySqlConnection) -> Result<Counters> {
    let rows = sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Handler\\_read\\_%' \
         OR Variable_name IN ('Rows_read', 'Innodb_rows_read', 'Questions')",
    )
    .fetch_all(conn)
    .await?;
    let text = |row: &sqlx::mysql::MySqlRow, i: usize| -> Result<String> {
        Ok(row.try_get::<String, _>(i).or_else(|_| {
            row.try_get::<Vec<u8>, _>(i)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })?)
    };
    let mut out = Counters::new();
    for row in &rows {
        out.insert(text(row, 0)?, text(row, 1)?.parse().unwrap_or(0));
    }
    ensure!(
        out.contains_key("Questions") && out.contains_key("Handler_read_key"),
        "SHOW GLOBAL STATUS answered {:?}",
        out.keys().collect::<Vec<_>>()
    );
    Ok(out)
}

fn since(after: &Counters, before: &Counters) -> Counters {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .collect()
}

/// The windows in which no other client sent a statement: those with the
/// fewest `Questions`.
fn kept(windows: &[Counters]) -> Vec<&Counters> {
    let fewest = windows.iter().map(|w| w["Questions"]).min();
    windows
        .iter()
        .filter(|w| Some(w["Questions"]) == fewest)
        .collect()
}

/// The median (the lower middle) of counter `name` over `windows`; 0
/// for a counter the server does not have.
fn median(windows: &[&Counters], name: &str) -> i64 {
    let mut v: Vec<i64> = windows
        .iter()
        .map(|w| w.get(name).copied().unwrap_or(0))
        .collect();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

impl BacklogFigures {
    /// The phase as a Markdown section.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## One claim against one key's backlog\n");
        let _ = writeln!(
            out,
            "One claim of one job (`JobStore::claim_batch`, as the coordinator's claim pipeline \
             sends a lone Claim) on a queue whose ready jobs all have one fairness key, with {} \
             of them and then with {} ({:.1} s to enqueue); its database work read from the \
             server's counters: global ones (the claim runs on the store's own sessions), so \
             a window in which any other client sent a statement is left out, and of the windows \
             kept the median, less that of empty windows. Per claim:\n",
            self.small.ready,
            self.large.ready,
            self.fill.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "| ready jobs of the key | handler reads | by counter | rows read | statements | windows kept |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for w in [&self.small, &self.large] {
            let by: Vec<String> = w.handler.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} of {} |",
                w.ready,
                w.handler_reads(),
                by.join(", "),
                w.rows_read,
                w.statements,
                w.kept.0,
                w.kept.1
            );
        }
        out
    }
}
