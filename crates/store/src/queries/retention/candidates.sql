-- Pruning: up to ? terminal jobs whose retention ended (DB clock): their
-- queue's stored retention, else the coordinator's default. A plain read
-- (no locks); the batch then locks the ids it got with SKIP LOCKED and
-- re-checks the state. The first bound is the shortest retention of any
-- queue, so the scan is a range of ix_jobs_finished per terminal state.
-- Binds: shortest retention (us), default retention (us), batch size.
SELECT j.id
FROM jobs j FORCE INDEX (ix_jobs_finished)
LEFT JOIN queue_policies p ON p.queue = j.queue
WHERE j.state IN ('succeeded', 'failed', 'cancelled')
  AND j.finished_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)
  AND j.finished_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL COALESCE(p.job_retention_us, ?) MICROSECOND)
LIMIT ?
