-- ResumeQueue: its claims hand out again. Binds: operator, queue.
UPDATE queue_policies
SET paused_at = NULL, paused_by = NULL, pause_reason = NULL,
    updated_at = UTC_TIMESTAMP(6), updated_by = ?
WHERE queue = ? AND paused_at IS NOT NULL
