-- PutProvider of a new provider: its budget starts full (tat = now offers
-- the whole burst). Binds: name, rate_per_second, burst, max_in_flight,
-- execute_cost, reconcile_cost, key_share, max_in_flight_per_key, operator.
INSERT INTO providers (name, rate_per_second, burst, max_in_flight, execute_cost,
                       reconcile_cost, key_share, max_in_flight_per_key,
                       tat, created_at, updated_at, updated_by)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?)
