-- Settled lines of provider {provider} decided while their job was still
-- ready or running (kept then as an observation for its reconcile), whose
-- job of the provider's queues {queues} has since failed or been
-- cancelled: undecided again, so that this import decides them
-- (REFUND_NOT_RECORDED: money moved that jobfence says did not). A line
-- decided after its job ended was decided knowing it, and is left alone.
-- From the jobs side, through ix_jobs_finished (failed and cancelled jobs
-- only, with an observation), then ix_settlement_lines_key per job.
UPDATE jobs j FORCE INDEX (ix_jobs_finished)
JOIN settlement_lines l
  ON l.provider = {provider} AND l.operation_key = j.operation_key
SET l.decided_at = NULL
WHERE j.state IN ('failed', 'cancelled') AND j.queue IN ({queues})
  AND j.has_observations = 1
  AND l.status = 'succeeded'
  AND l.decided_at IS NOT NULL AND l.decided_at < j.finished_at
