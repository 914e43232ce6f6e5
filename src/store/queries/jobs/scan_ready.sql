-- Claim scan 2: due ready jobs of a queue, oldest run_at first. Locks what
-- it returns; rows another claim holds are skipped.
-- FORCE INDEX: read in run_at order and stop at LIMIT. A table scan plus
-- filesort (which the optimizer may pick on a small or fresh table) would
-- lock every due row it sorted, and concurrent claims would find nothing.
SELECT id, state, attempt, next_action, dispatch_count,
       CAST(TIMESTAMPDIFF(MICROSECOND, first_dispatched_at, UTC_TIMESTAMP(6)) AS SIGNED) AS since_first_dispatch_us
FROM jobs FORCE INDEX (ix_jobs_claim_ready)
WHERE queue = ? AND state = 'ready' AND run_at <= UTC_TIMESTAMP(6)
ORDER BY run_at
LIMIT ?
FOR UPDATE SKIP LOCKED
