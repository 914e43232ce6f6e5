-- Sightings a day past their last call, a bounded batch per write. Binds:
-- the age in microseconds.
DELETE FROM worker_sightings
WHERE last_call_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY last_call_at
LIMIT 500
