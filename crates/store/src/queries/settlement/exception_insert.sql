INSERT INTO settlement_exceptions (
    provider, kind, severity, subject, job_id, detail, state, opened_at, updated_at
) VALUES (?, ?, ?, ?, ?, ?, 'open', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
