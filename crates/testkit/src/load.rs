//! Tables filled fast for the large tests: rows written by one `INSERT …
//! SELECT` each, as the bench's loaders write them
//! (crates/tools/src/bench/db.rs), where going through Enqueue would spend
//! the test's time on the seeding.

use sqlx::mysql::MySqlPool;

/// Rows 0..n from four digits (no recursive CTE: MariaDB stops those at
/// 1000 iterations by default, MySQL at 1000 levels).
const DIGITS: &str = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
    UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
    UNION ALL SELECT 8 UNION ALL SELECT 9)";

/// Loads `n` ready jobs of `queue`, keys `{prefix}-0` to `{prefix}-{n-1}`,
/// as an Enqueue of each without a delay, a fairness key or a priority
/// would write it (due now, never claimed, fair round 0: the claim scan
/// hands them out in id order), but without their `enqueued` events;
/// 10,000 rows a statement.
pub async fn ready_jobs(pool: &MySqlPool, queue: &str, prefix: &str, n: u64) {
    let sql = format!(
        "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, attempt, \
           next_action, run_at, dispatch_count, created_at, updated_at) \
         SELECT ?, CONCAT(?, '-', ? + k), UNHEX(SHA2(CONCAT(?, '-', ? + k), 256)), \
           CONCAT('{{\"amount\":', ? + k, '}}'), 'ready', 0, 'execute', UTC_TIMESTAMP(6), 0, \
           UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) \
         FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS k \
               FROM {DIGITS} a, {DIGITS} b, {DIGITS} c, {DIGITS} e) AS seq \
         WHERE k < ? ORDER BY k"
    );
    let mut done = 0;
    while done < n {
        let chunk = (n - done).min(10_000);
        sqlx::query(&sql)
            .bind(queue)
            .bind(prefix)
            .bind(done)
            .bind(prefix)
            .bind(done)
            .bind(done)
            .bind(chunk)
            .execute(pool)
            .await
            .expect("loading ready jobs");
        done += chunk;
    }
}
