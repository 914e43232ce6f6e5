-- One provider's row, locked until COMMIT: an operator's change of a
-- provider locks it first, as every claim of its queues does (budget.rs),
-- so a claim runs entirely before or entirely after the change.
SELECT name, rate_per_second, burst, max_in_flight, execute_cost, reconcile_cost, key_share,
       max_in_flight_per_key, tat, pause,
       pause_reason, throttled_until, throttle_reports, updated_at, updated_by,
       UTC_TIMESTAMP(6) AS now
FROM providers WHERE name = ? FOR UPDATE
