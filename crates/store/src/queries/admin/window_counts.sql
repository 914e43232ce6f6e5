-- Takeovers and stale-write rejections of the last ? microseconds, per
-- queue: a range scan of ix_job_events_kind_created over just those kinds.
SELECT queue, kind, COUNT(*) AS n
FROM job_events
WHERE kind IN ('taken_over', 'stale_write_rejected')
  AND created_at >= DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)
GROUP BY queue, kind
