-- The state changes of the last ? microseconds, per queue, in 5-second
-- buckets counted back from now (bucket 0: the last 5 s), by the states
-- they went from and to: what the console's trends are rebuilt from. A
-- range scan of ix_job_events_kind_created over the kinds that move a job.
SELECT queue,
       TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) DIV 5000000 AS bucket,
       from_state, to_state, COUNT(*) AS n
FROM job_events
WHERE kind IN ('enqueued', 'claimed', 'completed', 'retry_scheduled', 'failed',
               'manual_review', 'manual_review_resolved', 'cancelled')
  AND created_at >= DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)
GROUP BY queue, bucket, from_state, to_state
