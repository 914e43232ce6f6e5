-- One queue's row, locked until COMMIT (DeleteQueuePolicy).
SELECT queue, provider, resend_window_us, max_dispatches, job_retention_us, updated_at, updated_by
FROM queue_policies WHERE queue = ? FOR UPDATE
