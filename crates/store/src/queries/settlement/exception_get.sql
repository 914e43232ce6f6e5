SELECT id, provider, kind, subject, job_id, detail, state, opened_at, updated_at
FROM settlement_exceptions WHERE id = ?
