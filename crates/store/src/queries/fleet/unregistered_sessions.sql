-- Sessions of this node, of the coordinators' user, on this database, that
-- no jobfence process of 0.2.0 or newer registered: possibly a
-- coordinator of a release that writes no heartbeat. A few, to name.
SELECT p.ID AS id, p.HOST AS host
FROM information_schema.PROCESSLIST p
WHERE p.USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)
  AND p.DB = DATABASE()
  AND p.ID <> CONNECTION_ID()
  AND p.ID NOT IN (
      SELECT s.connection_id
      FROM coordinator_sessions s
      WHERE s.node = CONCAT(@@hostname, ':', @@port))
ORDER BY p.ID
LIMIT 5
