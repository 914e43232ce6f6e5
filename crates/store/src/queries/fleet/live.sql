-- The coordinators seen within the bind (microseconds), newest first.
SELECT name, release_version, schema_version,
       TIMESTAMPDIFF(MICROSECOND, last_seen_at, UTC_TIMESTAMP(6)) AS ago_us
FROM coordinators
WHERE last_seen_at >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY last_seen_at DESC
