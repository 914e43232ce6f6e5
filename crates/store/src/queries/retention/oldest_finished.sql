-- The age of the oldest finished job still held, by the DB clock (the
-- retention gauges): one dive into ix_jobs_finished per terminal state.
SELECT CAST(TIMESTAMPDIFF(MICROSECOND, MIN(f), UTC_TIMESTAMP(6)) AS SIGNED) FROM (
  SELECT MIN(finished_at) AS f FROM jobs WHERE state = 'succeeded'
  UNION ALL SELECT MIN(finished_at) FROM jobs WHERE state = 'failed'
  UNION ALL SELECT MIN(finished_at) FROM jobs WHERE state = 'cancelled') AS t
