-- Settled lines of provider {provider} whose job of the provider's queues
-- {queues} is failed or cancelled, and whose key has no REFUND_NOT_RECORDED
-- or DOUBLE_REFUND exception, in any state: undecided again, so that this
-- import decides them (REFUND_NOT_RECORDED: money moved that jobfence says
-- did not). Such a line was decided while its job was still ready or
-- running (kept then as an observation for its reconcile): a line decided
-- once its job had ended raised one of the two, and is left alone, as is
-- one whose exception a person resolved. Decided by what was raised, not
-- by comparing when the line was decided with when the job finished: the
-- decision reads the job unlocked, and a worker's Fail between that read
-- and the mark would leave the line decided after the job's end.
-- A key two of the provider's queues used, one job succeeded with the
-- refund's reference and one failed with an observation, is decided for
-- the first (see crates/domain/src/settlement/held.rs): matched, with no
-- exception, so its line is decided again at every import; the outcome
-- stays the same.
-- From the jobs side, through ix_jobs_finished (failed and cancelled jobs
-- only, with an observation), then ix_settlement_lines_key per job, then
-- uq_settlement_exceptions per line.
UPDATE jobs j FORCE INDEX (ix_jobs_finished)
JOIN settlement_lines l
  ON l.provider = {provider} AND l.operation_key = j.operation_key
SET l.decided_at = NULL
WHERE j.state IN ('failed', 'cancelled') AND j.queue IN ({queues})
  AND j.has_observations = 1
  AND l.status = 'succeeded'
  AND l.decided_at IS NOT NULL
  AND NOT EXISTS (
    SELECT 1 FROM settlement_exceptions e
    WHERE e.provider = {provider}
      AND e.kind IN ('REFUND_NOT_RECORDED', 'DOUBLE_REFUND')
      AND e.subject = j.operation_key)
