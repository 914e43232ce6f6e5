-- Fail with a retry disposition, fenced on id + state + attempt: ready again
-- after ? microseconds, to reconcile or to execute.
UPDATE jobs
SET state = 'ready',
    next_action = ?,
    run_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND),
    lease_until = NULL,
    last_error = ?,
    state_reason = NULL,
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ? AND state = 'running' AND attempt = ?
