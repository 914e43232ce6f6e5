-- Enqueue: a new job, due after ? microseconds (DB clock).
INSERT INTO jobs (
    queue, operation_key, request_digest, payload, state, attempt, next_action,
    run_at, dispatch_count, created_at, updated_at
) VALUES (
    ?, ?, ?, ?, 'ready', 0, 'execute',
    DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
)
