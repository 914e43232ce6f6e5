-- The running or parked job of a queue that entered its state the longest
-- ago: updated_at is set by the claim, takeover or park and by nothing
-- while the job stays (a lease renewal leaves it alone). Reads the
-- (state, queue) range of ix_jobs_state_queue: the running set is bounded
-- by the workers' concurrency, the parked set by the operators' backlog.
SELECT id,
       CAST(TIMESTAMPDIFF(MICROSECOND, updated_at, UTC_TIMESTAMP(6)) AS SIGNED) AS age_us
FROM jobs
WHERE state = ? AND queue = ?
ORDER BY updated_at, id
LIMIT 1
