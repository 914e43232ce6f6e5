-- One page of the events feed, up to the horizon the lock probe allows
-- (events_feed.rs). Binds: cursor, horizon, limit.
SELECT e.id, e.job_id, e.queue, j.operation_key, e.attempt, e.kind,
       e.from_state, e.to_state, e.current_attempt, e.detail, e.created_at
FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE e.id > ? AND e.id <= ? ORDER BY e.id LIMIT ?
