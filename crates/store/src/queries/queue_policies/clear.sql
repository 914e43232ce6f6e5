-- DeleteQueuePolicy: the queue's stored policy goes; its provider, if any,
-- stays. Binds: operator, queue.
UPDATE queue_policies SET resend_window_us = NULL, max_dispatches = NULL,
    job_retention_us = NULL, updated_at = UTC_TIMESTAMP(6), updated_by = ?
WHERE queue = ?
