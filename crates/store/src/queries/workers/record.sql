-- What one coordinator saw of its workers since its last write: one row
-- per worker, `{rows}` of
-- (?, ?, ?, ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND,
--  UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, ?)
-- binding worker_id, coordinator, client, queue, the microseconds since its
-- first call and since its last one (the coordinator's monotonic clock,
-- placed on the database's), and its calls in the last minute. Rows in
-- worker_id order, so two writes lock in one order.
INSERT INTO worker_sightings (
    worker_id, coordinator, client, queue, first_seen_at, last_call_at, calls_last_minute
)
VALUES {rows}
ON DUPLICATE KEY UPDATE
    client = VALUES(client),
    queue = VALUES(queue),
    first_seen_at = LEAST(first_seen_at, VALUES(first_seen_at)),
    last_call_at = GREATEST(last_call_at, VALUES(last_call_at)),
    calls_last_minute = VALUES(calls_last_minute)
