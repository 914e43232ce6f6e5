-- Succeeded jobs of the provider's queues {queues} that finished inside a
-- covered period of provider {provider}, longer ago than its lag, with no
-- settled line for their key: one page, by (finished_at, id) after the
-- given one, through ix_jobs_finished. Binds: lag in microseconds, the
-- page's start (finished_at twice, id), its size. "No settled line" is an
-- anti-join (LEFT JOIN … IS NULL), not NOT EXISTS: both servers then probe
-- ix_settlement_lines_key once per job, where MariaDB would materialize
-- every settled line of the provider first (about 5× slower at 200,000).
-- The index holds the line's status (migration 20261211000001), so the
-- probe reads no line's row.
SELECT j.id AS job_id, CAST(j.operation_key AS CHAR) AS operation_key, j.finished_at
FROM jobs j FORCE INDEX (ix_jobs_finished)
LEFT JOIN settlement_lines l
  ON l.provider = {provider} AND l.operation_key = j.operation_key
     AND l.status = 'succeeded'
WHERE j.state = 'succeeded' AND j.queue IN ({queues})
  AND j.finished_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
  AND (j.finished_at > ? OR (j.finished_at = ? AND j.id > ?))
  AND EXISTS (
    SELECT 1 FROM settlement_periods p
    WHERE p.provider = {provider}
      AND j.finished_at >= p.period_start AND j.finished_at < p.period_end)
  AND l.id IS NULL
ORDER BY j.finished_at, j.id
LIMIT ?
