-- PauseQueue: the queue's row, made if it has none, paused (since its
-- first pause; the latest operator and reason). Binds: queue, operator,
-- reason, operator, then operator, reason, operator for the update.
INSERT INTO queue_policies (queue, paused_at, paused_by, pause_reason, updated_at, updated_by)
VALUES (?, UTC_TIMESTAMP(6), ?, ?, UTC_TIMESTAMP(6), ?)
ON DUPLICATE KEY UPDATE
    paused_at = COALESCE(paused_at, UTC_TIMESTAMP(6)),
    paused_by = ?,
    pause_reason = ?,
    updated_at = UTC_TIMESTAMP(6),
    updated_by = ?
