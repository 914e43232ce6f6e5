-- Age of the first-created job of one (state, queue): ids grow with
-- creation, and ix_jobs_state_queue is in (state, queue, id) order, so this
-- is one index dive.
SELECT CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS SIGNED) AS age_us
FROM jobs
WHERE state = ? AND queue = ?
ORDER BY id
LIMIT 1
