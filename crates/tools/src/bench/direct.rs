//! The baseline: workers running the article's lifecycle themselves, on
//! jobfence's schema, with no coordinator. A claim transaction (`SELECT …
//! FOR UPDATE SKIP LOCKED` on the claim index, then `attempt + 1`), then
//! the fenced complete transaction with its event: what a team would write
//! without jobfence. The same under a provider's budget, as a team would
//! keep it itself: the provider's row locked first in the claim
//! transaction, checked and spent (GCRA, as jobfence keeps it). And the
//! same with many jobs per transaction: the batched ceiling of this
//! database on this machine.

use super::{Latencies, PhaseRun};
use anyhow::{ensure, Context, Result};
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const CLAIM_ONE: &str = "SELECT id, attempt FROM jobs FORCE INDEX (ix_jobs_claim_ready) \
     WHERE queue = ? AND state = 'ready' AND run_at <= UTC_TIMESTAMP(6) \
     ORDER BY run_at LIMIT ? FOR UPDATE SKIP LOCKED";

const HAND_OUT: &str = "UPDATE jobs SET attempt = attempt + 1, state = 'running', \
     lease_until = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL 30 SECOND), lease_owner = ?, \
     dispatch_count = dispatch_count + 1, \
     first_dispatched_at = COALESCE(first_dispatched_at, UTC_TIMESTAMP(6)), \
     updated_at = UTC_TIMESTAMP(6) \
     WHERE id = ? AND state = 'ready' AND attempt = ?";

/// The budget's row, locked, and whether one more unit may be spent now
/// (GCRA: `max(tat, now) + T ≤ now + burst·T`, `T = 1 / rate`).
const LOCK_BUDGET: &str = "SELECT GREATEST(tat, UTC_TIMESTAMP(6)) \
     + INTERVAL ROUND(1000000 / rate_per_second) MICROSECOND \
     <= UTC_TIMESTAMP(6) + INTERVAL ROUND(burst * 1000000 / rate_per_second) MICROSECOND \
     AS allowed FROM providers WHERE name = ? FOR UPDATE";

/// One unit spent: the new theoretical arrival time.
const SPEND: &str = "UPDATE providers \
     SET tat = GREATEST(tat, UTC_TIMESTAMP(6)) + INTERVAL ROUND(1000000 / rate_per_second) MICROSECOND \
     WHERE name = ?";

const COMPLETE: &str = "UPDATE jobs SET state = 'succeeded', provider_reference = ?, \
     lease_until = NULL, updated_at = UTC_TIMESTAMP(6), finished_at = UTC_TIMESTAMP(6) \
     WHERE id = ? AND state = 'running' AND attempt = ?";

const EVENT: &str = "INSERT INTO job_events (job_id, queue, attempt, kind, from_state, \
     to_state, current_attempt, detail, created_at) \
     VALUES (?, ?, ?, 'completed', 'running', 'succeeded', ?, ?, UTC_TIMESTAMP(6))";

/// `workers` connections each claim one job and complete it, until the
/// queue is empty; with `budget`, each claim spends a unit of that
/// provider's budget in its own transaction (the provider's row locked
/// first, as jobfence's claim does). A transaction the database rolls
/// back for a deadlock or a lock wait is run again, as any worker would
/// (see [`again`]).
pub async fn lifecycle(
    pool: &MySqlPool,
    queue: &str,
    workers: usize,
    budget: Option<&str>,
) -> Result<PhaseRun> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (pool, done, queue) = (pool.clone(), done.clone(), queue.to_owned());
        let budget = budget.map(str::to_owned);
        tasks.spawn(async move {
            let mut lat = Latencies::default();
            let owner = format!("direct-{w}");
            let budget = budget.as_deref();
            loop {
                let t = Instant::now();
                let claimed = again(|| claim_one(&pool, &queue, &owner, budget)).await?;
                let Some((id, attempt)) = claimed else {
                    return Ok::<_, anyhow::Error>(lat);
                };
                lat.claim.push(t.elapsed());
                let t = Instant::now();
                again(|| complete_one(&pool, &queue, id, attempt)).await?;
                lat.complete.push(t.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let latencies = join(tasks).await?;
    report_reruns();
    Ok(PhaseRun {
        jobs: done.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        latencies,
    })
}

/// The direct claim transaction: (id, attempt before the claim) of the
/// job claimed, or `None` when the queue is empty. With `budget`, the
/// provider's row is locked and checked first and the unit spent before
/// the COMMIT (a budget with no unit left is an error: the phase's budget
/// is far above the load).
async fn claim_one(
    pool: &MySqlPool,
    queue: &str,
    owner: &str,
    budget: Option<&str>,
) -> Result<Option<(u64, u64)>> {
    let mut tx = pool.begin().await?;
    if let Some(provider) = budget {
        let row = sqlx::query(LOCK_BUDGET)
            .bind(provider)
            .fetch_one(&mut *tx)
            .await?;
        ensure!(
            row.try_get::<i64, _>("allowed")? != 0,
            "the budget of {provider} ran out"
        );
    }
    let Some(row) = sqlx::query(CLAIM_ONE)
        .bind(queue)
        .bind(1u32)
        .fetch_optional(&mut *tx)
        .await?
    else {
        tx.rollback().await?;
        return Ok(None);
    };
    let (id, attempt): (u64, u64) = (row.get("id"), row.get("attempt"));
    let claimed = sqlx::query(HAND_OUT)
        .bind(owner)
        .bind(id)
        .bind(attempt)
        .execute(&mut *tx)
        .await?;
    ensure!(
        claimed.rows_affected() == 1,
        "job {id} changed under its lock"
    );
    if let Some(provider) = budget {
        sqlx::query(SPEND).bind(provider).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(Some((id, attempt)))
}

/// The direct fenced complete transaction of job `id` claimed at
/// `attempt` (before the claim), with its event.
async fn complete_one(pool: &MySqlPool, queue: &str, id: u64, attempt: u64) -> Result<()> {
    let mut tx = pool.begin().await?;
    let completed = sqlx::query(COMPLETE)
        .bind("re_bench")
        .bind(id)
        .bind(attempt + 1)
        .execute(&mut *tx)
        .await?;
    ensure!(
        completed.rows_affected() == 1,
        "complete of job {id} not applied"
    );
    sqlx::query(EVENT)
        .bind(id)
        .bind(queue)
        .bind(attempt + 1)
        .bind(attempt + 1)
        .bind("re_bench")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Direct transactions the database rolled back and [`again`] ran again.
static RERUNS: AtomicU64 = AtomicU64::new(0);

/// Runs the transaction `tx` until the database does not roll it back
/// for a deadlock (1213) or a lock wait timeout (1205): what a worker
/// running its own SQL must do too (at 64 workers the direct lifecycle
/// met a deadlock). A rolled-back
/// transaction wrote nothing, so running it again is safe; the fenced
/// complete checks its attempt again.
async fn again<T, F, Fut>(mut tx: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    loop {
        match tx().await {
            Err(e) if rolled_back(&e) => {
                RERUNS.fetch_add(1, Ordering::Relaxed);
            }
            other => return other,
        }
    }
}

fn rolled_back(e: &anyhow::Error) -> bool {
    e.downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|d| matches!(d.number(), 1205 | 1213))
}

/// Says how many direct transactions were run again since the last call.
fn report_reruns() {
    let n = RERUNS.swap(0, Ordering::Relaxed);
    if n > 0 {
        eprintln!(
            "bench: {n} direct transactions rolled back by the database (deadlock or lock wait) \
             and run again"
        );
    }
}

/// The batched ceiling: `connections` connections each claim `batch` jobs
/// in one transaction and complete them in another (one fenced UPDATE per
/// job, one multi-row event insert), until the queue is empty.
pub async fn batched(
    pool: &MySqlPool,
    queue: &str,
    connections: usize,
    batch: u32,
) -> Result<PhaseRun> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..connections {
        let (pool, done, queue) = (pool.clone(), done.clone(), queue.to_owned());
        tasks.spawn(async move {
            let mut lat = Latencies::default();
            let owner = format!("batched-{w}");
            loop {
                let t = Instant::now();
                let Some(jobs) = again(|| claim_batch(&pool, &queue, &owner, batch)).await? else {
                    return Ok::<_, anyhow::Error>(lat);
                };
                lat.claim.push(t.elapsed());
                let t = Instant::now();
                again(|| complete_batch(&pool, &queue, &jobs)).await?;
                lat.complete.push(t.elapsed());
                done.fetch_add(jobs.len() as u64, Ordering::Relaxed);
            }
        });
    }
    let latencies = join(tasks).await?;
    report_reruns();
    Ok(PhaseRun {
        jobs: done.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        latencies,
    })
}

/// Claims up to `batch` ready jobs of `queue` for `owner` in one
/// transaction: their (id, new attempt), or `None` when the queue is
/// empty.
async fn claim_batch(
    pool: &MySqlPool,
    queue: &str,
    owner: &str,
    batch: u32,
) -> Result<Option<Vec<(u64, u64)>>> {
    let mut tx = pool.begin().await?;
    let rows = sqlx::query(CLAIM_ONE)
        .bind(queue)
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(None);
    }
    let jobs: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| (r.get("id"), r.get::<u64, _>("attempt") + 1))
        .collect();
    let ids = placeholders(jobs.len());
    let sql = format!(
        "UPDATE jobs SET attempt = attempt + 1, state = 'running', \
         lease_until = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL 30 SECOND), lease_owner = ?, \
         dispatch_count = dispatch_count + 1, \
         first_dispatched_at = COALESCE(first_dispatched_at, UTC_TIMESTAMP(6)), \
         updated_at = UTC_TIMESTAMP(6) WHERE state = 'ready' AND id IN ({ids})"
    );
    let mut q = sqlx::query(&sql).bind(owner);
    for (id, _) in &jobs {
        q = q.bind(id);
    }
    let claimed = q.execute(&mut *tx).await?;
    ensure!(
        claimed.rows_affected() == jobs.len() as u64,
        "claimed rows changed"
    );
    tx.commit().await?;
    Ok(Some(jobs))
}

/// Completes the claimed `jobs` in one transaction: one fenced UPDATE per
/// job, one multi-row insert of their completion events.
async fn complete_batch(pool: &MySqlPool, queue: &str, jobs: &[(u64, u64)]) -> Result<()> {
    let mut tx = pool.begin().await?;
    for (id, attempt) in jobs {
        let completed = sqlx::query(COMPLETE)
            .bind("re_bench")
            .bind(id)
            .bind(attempt)
            .execute(&mut *tx)
            .await?;
        ensure!(
            completed.rows_affected() == 1,
            "complete of job {id} not applied"
        );
    }
    let values =
        vec!["(?, ?, ?, 'completed', 'running', 'succeeded', ?, ?, UTC_TIMESTAMP(6))"; jobs.len()]
            .join(", ");
    let sql = format!(
        "INSERT INTO job_events (job_id, queue, attempt, kind, from_state, \
         to_state, current_attempt, detail, created_at) VALUES {values}"
    );
    let mut q = sqlx::query(&sql);
    for (id, attempt) in jobs {
        q = q
            .bind(id)
            .bind(queue)
            .bind(attempt)
            .bind(attempt)
            .bind("re_bench");
    }
    q.execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Single-row autocommit inserts by `callers` connections: what Enqueue
/// costs without a coordinator.
pub async fn inserts(pool: &MySqlPool, queue: &str, jobs: u64, callers: usize) -> Result<PhaseRun> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (pool, next, queue) = (pool.clone(), next.clone(), queue.to_owned());
        tasks.spawn(async move {
            let mut lat = Latencies::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let t = Instant::now();
                sqlx::query(
                    "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, \
                     attempt, next_action, run_at, dispatch_count, created_at, updated_at) \
                     VALUES (?, ?, UNHEX(SHA2(?, 256)), ?, 'ready', 0, 'execute', \
                     UTC_TIMESTAMP(6), 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                )
                .bind(&queue)
                .bind(format!("direct-{i}"))
                .bind("{}")
                .bind("{}")
                .execute(&pool)
                .await
                .context("insert")?;
                lat.claim.push(t.elapsed());
            }
        });
    }
    let latencies = join(tasks).await?;
    Ok(PhaseRun {
        jobs,
        elapsed: started.elapsed(),
        latencies,
    })
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Waits for every task; their latencies merged.
pub(super) async fn join(mut tasks: tokio::task::JoinSet<Result<Latencies>>) -> Result<Latencies> {
    let mut all = Latencies::default();
    while let Some(done) = tasks.join_next().await {
        let lat = done.context("a benchmark task panicked")??;
        all.claim.extend(lat.claim);
        all.complete.extend(lat.complete);
    }
    Ok(all)
}

/// Median time of `SELECT 1` over `n` calls on one connection: the cost of
/// a database round trip.
pub async fn db_round_trip(pool: &MySqlPool, n: usize) -> Result<std::time::Duration> {
    let mut conn = pool.acquire().await?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        times.push(t.elapsed());
    }
    times.sort_unstable();
    Ok(times[n / 2])
}
