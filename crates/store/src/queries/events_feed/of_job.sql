-- Every event of one job, oldest first.
SELECT e.id, e.job_id, e.queue, j.operation_key, e.attempt, e.kind,
       e.from_state, e.to_state, e.current_attempt, e.detail, e.created_at
FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE e.job_id = ? ORDER BY e.id
