-- The oldest due age of a queue's ready jobs outside its top fairness keys
-- (the keys, as a JSON array, left out).
SELECT CAST(TIMESTAMPDIFF(MICROSECOND, MIN(run_at), UTC_TIMESTAMP(6)) AS SIGNED) AS age_us
FROM jobs FORCE INDEX (ix_jobs_fair)
WHERE queue = ? AND state = 'ready' AND run_at <= UTC_TIMESTAMP(6)
  AND NOT JSON_CONTAINS(?, JSON_QUOTE(fairness_key))
