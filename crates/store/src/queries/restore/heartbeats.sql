-- The coordinators' heartbeats written within the bind (microseconds):
-- the name, and when (DB clock, as text, to compare two reads exactly).
SELECT name, CAST(last_seen_at AS CHAR) AS seen,
       CAST(TIMESTAMPDIFF(MICROSECOND, last_seen_at, UTC_TIMESTAMP(6)) AS SIGNED) AS ago_us
FROM coordinators
WHERE last_seen_at >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY name
