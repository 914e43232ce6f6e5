-- CancelJob: only a ready job that was never dispatched (no provider call
-- can have happened), fenced on id + state + attempt. A claim that locked
-- the row first wins and this matches 0 rows; a claim that comes later skips
-- the locked row, then finds it cancelled.
UPDATE jobs
SET state = 'cancelled',
    state_reason = ?,
    updated_at = UTC_TIMESTAMP(6),
    finished_at = UTC_TIMESTAMP(6)
WHERE id = ? AND state = 'ready' AND attempt = ? AND dispatch_count = 0
