-- Every queue row (a stored policy or a provider), by queue.
SELECT queue, provider, resend_window_us, max_dispatches, job_retention_us, updated_at, updated_by
FROM queue_policies ORDER BY queue
