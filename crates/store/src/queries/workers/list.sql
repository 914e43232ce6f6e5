-- The sightings of the last `?` microseconds, every coordinator's, with
-- their ages on the database clock.
SELECT worker_id, coordinator, client, queue, calls_last_minute,
       TIMESTAMPDIFF(MICROSECOND, first_seen_at, UTC_TIMESTAMP(6)) AS first_seen_us,
       TIMESTAMPDIFF(MICROSECOND, last_call_at, UTC_TIMESTAMP(6)) AS last_call_us
FROM worker_sightings
WHERE last_call_at >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY worker_id, last_call_at DESC
LIMIT 10000
