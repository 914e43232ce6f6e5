-- Entries of the append-only event log, in the caller's transaction: every
-- transition of a batch and every refused stale write, in the batch's order.
-- One row of placeholders per event (small batches; larger ones use
-- insert_events_json.sql).
INSERT INTO job_events (
    job_id, queue, attempt, kind, from_state, to_state, current_attempt,
    request_digest, detail, created_at
) VALUES {rows}
