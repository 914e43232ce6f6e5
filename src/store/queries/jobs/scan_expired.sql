-- Claim scan 1 (inline takeover): running jobs of a queue whose lease has
-- expired by the DB clock. Locks what it returns; rows another claim holds
-- are skipped, never waited for. FORCE INDEX for the reason given in
-- scan_ready.sql: lock only the rows taken, never the whole due set.
SELECT id, state, attempt, next_action, dispatch_count,
       CAST(TIMESTAMPDIFF(MICROSECOND, first_dispatched_at, UTC_TIMESTAMP(6)) AS SIGNED) AS since_first_dispatch_us
FROM jobs FORCE INDEX (ix_jobs_claim_expired)
WHERE queue = ? AND state = 'running' AND lease_until <= UTC_TIMESTAMP(6)
ORDER BY lease_until
LIMIT ?
FOR UPDATE SKIP LOCKED
