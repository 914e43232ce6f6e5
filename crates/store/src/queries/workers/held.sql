-- The running jobs of the queues `{queues}` (one placeholder each), by
-- their lease's owner, with the microseconds left on each lease (negative:
-- expired, not yet taken over). Reads ix_jobs_claim_expired per queue.
SELECT lease_owner, id, queue, attempt,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) AS lease_left_us
FROM jobs
WHERE queue IN ({queues}) AND state = 'running'
ORDER BY lease_owner, id
LIMIT 10000
