-- PutQueuePolicy: the queue's stored resend policy and job retention (they
-- win over the coordinators' flags, docs/design.md rule 13). Binds: queue,
-- resend_window_us, max_dispatches, job_retention_us, operator.
INSERT INTO queue_policies (queue, resend_window_us, max_dispatches, job_retention_us,
                            updated_at, updated_by)
VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), ?)
ON DUPLICATE KEY UPDATE resend_window_us = VALUES(resend_window_us),
    max_dispatches = VALUES(max_dispatches), job_retention_us = VALUES(job_retention_us),
    updated_at = VALUES(updated_at), updated_by = VALUES(updated_by)
