-- The event for a recorded observation, with the job's queue and current
-- attempt read from the job (locked by lock_job.sql).
INSERT INTO job_events (
    job_id, queue, attempt, kind, from_state, to_state, current_attempt,
    request_digest, detail, created_at
)
SELECT id, queue, ?, 'observation_recorded', state, NULL, attempt, NULL, ?, UTC_TIMESTAMP(6)
FROM jobs
WHERE id = ?
