-- One entry of the append-only event log, in the caller's transaction.
INSERT INTO job_events (
    job_id, queue, attempt, kind, from_state, to_state, current_attempt,
    request_digest, detail, created_at
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))
