-- The same for pruned jobs, by their key records (docs/design.md rule 14):
-- one page by job id after the given one, the same anti-join.
SELECT k.job_id, CAST(k.operation_key AS CHAR) AS operation_key, k.finished_at
FROM operation_keys k
LEFT JOIN settlement_lines l
  ON l.provider = {provider} AND l.operation_key = k.operation_key
     AND l.status = 'succeeded'
WHERE k.final_state = 'succeeded' AND k.queue IN ({queues})
  AND k.finished_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
  AND k.job_id > ?
  AND EXISTS (
    SELECT 1 FROM settlement_periods p
    WHERE p.provider = {provider}
      AND k.finished_at >= p.period_start AND k.finished_at < p.period_end)
  AND l.id IS NULL
ORDER BY k.job_id
LIMIT ?
