-- Claim scan 2: due ready jobs of a queue, oldest run_at first. Locks what
-- it returns; rows another claim holds are skipped. Uses ix_jobs_claim_ready.
SELECT id, state, attempt, next_action, dispatch_count,
       CAST(TIMESTAMPDIFF(MICROSECOND, first_dispatched_at, UTC_TIMESTAMP(6)) AS SIGNED) AS since_first_dispatch_us
FROM jobs
WHERE queue = ? AND state = 'ready' AND run_at <= UTC_TIMESTAMP(6)
ORDER BY run_at
LIMIT ?
FOR UPDATE SKIP LOCKED
