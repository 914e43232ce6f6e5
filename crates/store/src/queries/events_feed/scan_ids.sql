-- The next event ids after the cursor, by primary key, with how long ago
-- each was written (DB clock).
SELECT id,
       CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) AS SIGNED) AS age_us
FROM job_events
WHERE id > ?
ORDER BY id
LIMIT ?
