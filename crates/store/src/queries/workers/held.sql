-- The running jobs, by their lease's owner, with the microseconds left on
-- each lease (negative: expired, not yet taken over). A range scan of
-- ix_jobs_state_queue: as many rows as jobs run now, whatever the table
-- holds.
SELECT lease_owner, id, queue, attempt,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) AS lease_left_us
FROM jobs
WHERE state = 'running'
ORDER BY lease_owner, id
LIMIT 10000
