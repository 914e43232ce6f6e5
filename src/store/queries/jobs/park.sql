-- Fail to `failed` (terminal) or `manual_review`, fenced on id + state +
-- attempt. finished_at is set only for the terminal state.
UPDATE jobs
SET state = ?,
    lease_until = NULL,
    last_error = ?,
    state_reason = ?,
    updated_at = UTC_TIMESTAMP(6),
    finished_at = IF(?, UTC_TIMESTAMP(6), NULL)
WHERE id = ? AND state = 'running' AND attempt = ?
