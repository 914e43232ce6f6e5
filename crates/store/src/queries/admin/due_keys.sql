-- QueueStats of one queue: its due ready jobs by fairness key (docs/design.md
-- rule 18), the keys with the most first, and with them the count of keys
-- and of jobs of the whole queue (the window totals), so one pass answers
-- both the top keys and the rest. An operator's read: it reads every due
-- row of the queue, on the claim scan's own index.
SELECT fairness_key, n, age_us, keys_total, jobs_total FROM (
    SELECT fairness_key,
           COUNT(*) AS n,
           CAST(TIMESTAMPDIFF(MICROSECOND, MIN(run_at), UTC_TIMESTAMP(6)) AS SIGNED) AS age_us,
           CAST(COUNT(*) OVER () AS SIGNED) AS keys_total,
           CAST(SUM(COUNT(*)) OVER () AS SIGNED) AS jobs_total
    FROM jobs FORCE INDEX (ix_jobs_fair)
    WHERE queue = ? AND state = 'ready' AND run_at <= UTC_TIMESTAMP(6)
    GROUP BY fairness_key
) AS k
ORDER BY n DESC, age_us DESC, fairness_key
LIMIT ?
