//! What the benchmark reads and writes directly in the database: the
//! batching counters and the server's own status, the jobs it fills and
//! verifies, the finished rows it loads, and the settings it reports.

use super::procstat;
use super::report::Setting;
use super::QUEUE;
use anyhow::{bail, ensure, Context, Result};
use jobfence_domain::Enqueue;
use jobfence_store::JobStore;
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::time::{Duration, Instant};

/// Calls and transactions of the coordinator's batching pipelines.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchCounts {
    /// Calls, per pipeline (see [`BatchCounts::PIPELINES`]).
    pub calls: [f64; 3],
    /// Batches (transactions), per pipeline.
    pub batches: [f64; 3],
    /// Seconds the server spent answering Claim and Complete.
    pub rpc_seconds: [f64; 2],
    /// Claim and Complete calls answered.
    pub rpc_calls: [f64; 2],
}

impl BatchCounts {
    pub const PIPELINES: [&'static str; 3] = ["claim", "write", "enqueue"];

    pub(super) fn since(&self, before: &BatchCounts) -> BatchCounts {
        let mut out = *self;
        for i in 0..3 {
            out.calls[i] -= before.calls[i];
            out.batches[i] -= before.batches[i];
        }
        for i in 0..2 {
            out.rpc_seconds[i] -= before.rpc_seconds[i];
            out.rpc_calls[i] -= before.rpc_calls[i];
        }
        out
    }

    /// The batch-size histogram sums and counts, per pipeline, and the
    /// server-side time of Claim and Complete, from the coordinator's
    /// `/metrics` text.
    pub(super) fn parse(text: &str) -> BatchCounts {
        let mut out = BatchCounts::default();
        for line in text.lines() {
            for (i, pipeline) in BatchCounts::PIPELINES.iter().enumerate() {
                let label = format!("{{pipeline=\"{pipeline}\"}}");
                let value = |name: &str| {
                    line.strip_prefix(&format!("jobfence_batch_size_{name}{label} "))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                };
                if let Some(v) = value("sum") {
                    out.calls[i] = v;
                }
                if let Some(v) = value("count") {
                    out.batches[i] = v;
                }
            }
            // Server-side time of the worker RPCs, whatever their code.
            for (i, method) in ["Claim", "Complete"].iter().enumerate() {
                if !line.contains(&format!("method=\"{method}\"")) {
                    continue;
                }
                let v = || {
                    line.rsplit_once(' ')
                        .and_then(|(_, v)| v.parse::<f64>().ok())
                };
                if line.starts_with("jobfence_rpc_duration_seconds_sum{") {
                    out.rpc_seconds[i] += v().unwrap_or(0.0);
                } else if line.starts_with("jobfence_rpc_duration_seconds_count{") {
                    out.rpc_calls[i] += v().unwrap_or(0.0);
                }
            }
        }
        out
    }

    /// Mean server-side time of Claim (0) or Complete (1), if called.
    pub fn server_mean(&self, i: usize) -> Option<Duration> {
        (self.rpc_calls[i] > 0.0)
            .then(|| Duration::from_secs_f64(self.rpc_seconds[i] / self.rpc_calls[i]))
    }

    /// Mean calls per batch of a pipeline, if it ran.
    pub fn mean(&self, pipeline: &str) -> Option<f64> {
        let i = Self::PIPELINES.iter().position(|p| *p == pipeline)?;
        (self.batches[i] > 0.0).then(|| self.calls[i] / self.batches[i])
    }
}

/// Server counters of the database (statements, redo log fsyncs).
#[derive(Debug, Default, Clone, Copy)]
pub struct DbStatus {
    /// Statements clients sent (`Questions`).
    pub statements: u64,
    /// Data and redo log fsyncs (`Innodb_data_fsyncs`).
    pub fsyncs: u64,
}

impl DbStatus {
    pub(super) fn since(&self, before: &DbStatus) -> DbStatus {
        DbStatus {
            statements: self.statements.saturating_sub(before.statements),
            fsyncs: self.fsyncs.saturating_sub(before.fsyncs),
        }
    }
}

pub(super) async fn db_status(pool: &MySqlPool) -> Result<DbStatus> {
    let rows = sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Innodb_data_fsyncs')",
    )
    .fetch_all(pool)
    .await?;
    let mut out = DbStatus::default();
    for row in rows {
        let name: String = row.try_get::<String, _>(0).or_else(|_| {
            row.try_get::<Vec<u8>, _>(0)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })?;
        let value: String = row.try_get::<String, _>(1).or_else(|_| {
            row.try_get::<Vec<u8>, _>(1)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })?;
        let value: u64 = value.parse().unwrap_or(0);
        match name.as_str() {
            "Questions" => out.statements = value,
            "Innodb_data_fsyncs" => out.fsyncs = value,
            _ => {}
        }
    }
    Ok(out)
}

/// How many jobs the paced phase handed out, and the time from the first
/// hand-out to the last (DB clock); fails if a job was handed out or
/// completed more than once.
pub(super) async fn handed_out(pool: &MySqlPool) -> Result<(u64, Duration)> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS handed,            CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), MAX(created_at)) AS SIGNED) AS span_us,            (SELECT COUNT(*) FROM (SELECT job_id FROM job_events WHERE queue = ? AND kind IN ('claimed', 'completed')               GROUP BY job_id, kind HAVING COUNT(*) > 1) AS twice) AS twice          FROM job_events WHERE queue = ? AND kind = 'claimed'",
    )
    .bind(QUEUE)
    .bind(QUEUE)
    .fetch_one(pool)
    .await?;
    let (handed, span_us, twice): (i64, Option<i64>, i64) =
        (row.get("handed"), row.get("span_us"), row.get("twice"));
    ensure!(
        twice == 0,
        "VIOLATED: {twice} jobs handed out or completed twice"
    );
    Ok((
        handed.max(0) as u64,
        Duration::from_micros(span_us.unwrap_or(0).max(1) as u64),
    ))
}

/// Enqueues `jobs` ready jobs without a fairness key (not timed).
pub(super) async fn fill(pool: &MySqlPool, jobs: u64) -> Result<()> {
    fill_keyed(pool, QUEUE, 0..jobs, |_| None).await
}

/// Enqueues ready jobs `range` (their numbers, which name their keys) on
/// `queue`, job `k` with fairness key `key(k)` (not timed), a thousand to
/// an EnqueueBatch as the coordinator's pipeline would write them.
pub(super) async fn fill_keyed(
    pool: &MySqlPool,
    queue: &str,
    range: std::ops::Range<u64>,
    key: impl Fn(u64) -> Option<String>,
) -> Result<()> {
    let store = JobStore::new(pool.clone());
    let mut i = range.start;
    while i < range.end {
        let items: Vec<Enqueue> = (i..(i + 1000).min(range.end))
            .map(|k| Enqueue {
                queue: queue.into(),
                operation_key: format!("job-{k}"),
                payload: format!("{{\"amount\":{k}}}"),
                delay: Duration::ZERO,
                fairness_key: key(k),
                priority: Default::default(),
            })
            .collect();
        for r in store.enqueue_batch(&items).await? {
            ensure!(r?.created, "a fresh key was not created");
        }
        i += 1000;
    }
    Ok(())
}

/// Every job of the queue succeeded exactly once, with exactly one
/// completion event each.
pub(super) async fn verify(pool: &MySqlPool, jobs: u64) -> Result<()> {
    let row = sqlx::query(
        "SELECT \
           (SELECT COUNT(*) FROM jobs WHERE queue = ?) AS total, \
           (SELECT COUNT(*) FROM jobs WHERE queue = ? AND state = 'succeeded' AND attempt = 1) AS succeeded, \
           (SELECT COUNT(*) FROM job_events WHERE queue = ? AND kind = 'completed') AS completions, \
           (SELECT COUNT(*) FROM (SELECT job_id FROM job_events WHERE queue = ? AND kind = 'completed' \
              GROUP BY job_id HAVING COUNT(*) <> 1) AS twice) AS twice",
    )
    .bind(QUEUE)
    .bind(QUEUE)
    .bind(QUEUE)
    .bind(QUEUE)
    .fetch_one(pool)
    .await?;
    let (total, succeeded, completions, twice): (i64, i64, i64, i64) = (
        row.get("total"),
        row.get("succeeded"),
        row.get("completions"),
        row.get("twice"),
    );
    let jobs = jobs as i64;
    if total != jobs || succeeded != jobs || completions != jobs || twice != 0 {
        bail!(
            "VIOLATED: {jobs} jobs expected; {total} in the table, {succeeded} succeeded at attempt 1, \
             {completions} completion events, {twice} jobs with other than one completion"
        );
    }
    Ok(())
}

/// Loads `rows` succeeded jobs of another queue (with a completion event
/// each), as a table that has run for a while would hold, finished
/// `days_ago` days ago (DB clock).
pub(super) async fn load_finished(pool: &MySqlPool, rows: u64, days_ago: u32) -> Result<()> {
    let started = Instant::now();
    let chunk = 10_000u64;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        let mut tx = pool.begin().await?;
        let (last,): (Option<u64>,) = sqlx::query_as("SELECT MAX(id) FROM jobs")
            .fetch_one(&mut *tx)
            .await?;
        // Rows 0..n from four digits (no recursive CTE: MariaDB stops
        // those at 1000 iterations by default, MySQL at 1000 levels).
        let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                      UNION ALL SELECT 8 UNION ALL SELECT 9)";
        let sql = format!(
            "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, attempt, \
               next_action, run_at, dispatch_count, provider_reference, created_at, updated_at, finished_at) \
             SELECT 'archive', CONCAT('done-', ? + k), UNHEX(SHA2(CONCAT('done-', ? + k), 256)), \
               '{{\"amount\":1}}', 'succeeded', 1, 'execute', UTC_TIMESTAMP(6), 1, 're_old', \
               UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? DAY) \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS k \
                   FROM {digits} a, {digits} b, {digits} c, {digits} e) AS seq \
             WHERE k < ?"
        );
        sqlx::query(&sql)
            .bind(done)
            .bind(done)
            .bind(days_ago)
            .bind(n)
            .execute(&mut *tx)
            .await
            .context("loading finished jobs")?;
        sqlx::query(
            "INSERT INTO job_events (job_id, queue, attempt, kind, from_state, to_state, \
               current_attempt, detail, created_at) \
             SELECT id, queue, 1, 'completed', 'running', 'succeeded', 1, 're_old', UTC_TIMESTAMP(6) \
             FROM jobs WHERE id > ? AND queue = 'archive'",
        )
        .bind(last.unwrap_or(0))
        .execute(&mut *tx)
        .await
        .context("loading their events")?;
        tx.commit().await?;
        done += n;
        eprint!("\rbench: loading finished jobs {done}/{rows}");
    }
    eprintln!(" ({:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}

/// Waits (at most `limit`; `--settle-seconds`) until InnoDB has written
/// back the pages a bulk load dirtied and purged the rows it deleted: the
/// phase after it measures claims on a large table, not the background
/// writes of the load competing with them for this machine's two cores. A
/// zero `limit` does not wait.
pub(super) async fn settle(pool: &MySqlPool, limit: Duration) -> Result<()> {
    if limit.is_zero() {
        eprintln!("bench: not waiting for InnoDB to settle (--settle-seconds 0)");
        return Ok(());
    }
    let started = Instant::now();
    let (mut dirty, mut history) = (0u64, 0u64);
    while started.elapsed() < limit {
        let (name, value): (String, String) =
            sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")
                .fetch_one(pool)
                .await?;
        ensure!(
            name == "Innodb_buffer_pool_pages_dirty",
            "SHOW GLOBAL STATUS answered {name}"
        );
        dirty = value.parse().unwrap_or(0);
        let (h,): (i64,) = sqlx::query_as(
            "SELECT CAST(COUNT AS SIGNED) FROM information_schema.INNODB_METRICS \
             WHERE NAME = 'trx_rseg_history_len'",
        )
        .fetch_optional(pool)
        .await?
        .unwrap_or((0,));
        history = h.max(0) as u64;
        // 1000 pages of 16 KiB: 16 MiB left to write.
        if dirty < 1000 && history < 1000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "bench: waited {:.0} s for InnoDB to settle (dirty pages {dirty}, purge history {history})",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The settings the figures depend on.
pub(super) async fn read_settings(pool: &MySqlPool) -> Result<Vec<Setting>> {
    let row = sqlx::query(
        "SELECT VERSION() AS version, \
           CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS CHAR) AS flush, \
           CAST(@@GLOBAL.sync_binlog AS CHAR) AS sync_binlog, \
           CAST(@@GLOBAL.log_bin AS CHAR) AS log_bin, \
           CAST(@@GLOBAL.innodb_buffer_pool_size DIV 1048576 AS CHAR) AS buffer_pool_mib",
    )
    .fetch_one(pool)
    .await?;
    let text = |c: &str| -> String {
        row.try_get::<Vec<u8>, _>(c)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .or_else(|_| row.try_get::<String, _>(c))
            .unwrap_or_else(|_| "?".into())
    };
    // MySQL 8 names it transaction_isolation; MariaDB 10.11 tx_isolation.
    let mut isolation = "?".to_owned();
    for var in ["transaction_isolation", "tx_isolation"] {
        let sql = format!("SELECT CAST(@@SESSION.{var} AS CHAR) AS i");
        if let Ok(r) = sqlx::query(&sql).fetch_one(pool).await {
            if let Ok(b) = r.try_get::<Vec<u8>, _>("i") {
                isolation = String::from_utf8_lossy(&b).into_owned();
                break;
            }
        }
    }
    Ok(vec![
        Setting("database", text("version")),
        Setting("innodb_flush_log_at_trx_commit", text("flush")),
        Setting(
            "log_bin / sync_binlog",
            format!("{} / {}", text("log_bin"), text("sync_binlog")),
        ),
        Setting(
            "innodb_buffer_pool_size",
            format!("{} MiB", text("buffer_pool_mib")),
        ),
        Setting("isolation (coordinator and direct)", isolation),
    ])
}

/// The database server's process id, when it runs on this machine and
/// says where its pid file is.
pub(super) async fn db_server_pid(pool: &MySqlPool) -> Option<u32> {
    let row = sqlx::query("SELECT CAST(@@GLOBAL.pid_file AS CHAR) AS f")
        .fetch_one(pool)
        .await
        .ok()?;
    let file: String = row
        .try_get::<Vec<u8>, _>("f")
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .ok()?;
    let pid: u32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    procstat::cpu_time(pid).map(|_| pid)
}
