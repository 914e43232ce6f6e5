-- The ready job of a queue that has been due the longest: the first entry of
-- ix_jobs_claim_ready (the claim scan's own index). Jobs not yet due are not
-- pending work.
SELECT id,
       CAST(TIMESTAMPDIFF(MICROSECOND, run_at, UTC_TIMESTAMP(6)) AS SIGNED) AS age_us
FROM jobs
WHERE queue = ? AND state = 'ready' AND run_at <= UTC_TIMESTAMP(6)
ORDER BY run_at, id
LIMIT 1
