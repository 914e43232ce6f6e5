-- PutProvider of an existing provider: a changed budget keeps what was
-- spent, but never more than the new burst's worth (tat at most now plus
-- the new tolerance). Binds: rate_per_second, burst, max_in_flight,
-- execute_cost, reconcile_cost, key_share, max_in_flight_per_key,
-- tolerance (us), operator, name.
UPDATE providers SET rate_per_second = ?, burst = ?, max_in_flight = ?,
    execute_cost = ?, reconcile_cost = ?, key_share = ?, max_in_flight_per_key = ?,
    tat = LEAST(tat, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
    updated_at = UTC_TIMESTAMP(6), updated_by = ?
WHERE name = ?
