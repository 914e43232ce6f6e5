-- Every provider, by name (a plain read), with the DB clock its budget is
-- read at.
SELECT name, rate_per_second, burst, max_in_flight, execute_cost, reconcile_cost, key_share,
       max_in_flight_per_key, tat, pause,
       pause_reason, throttled_until, throttle_reports, updated_at, updated_by,
       UTC_TIMESTAMP(6) AS now
FROM providers ORDER BY name
