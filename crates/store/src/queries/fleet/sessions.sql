-- Sessions of this node, of the coordinators' user, on this database (this
-- one too: it is the process's own), and whether a jobfence process of 0.2.0 or newer registered
-- each: an unregistered one may be a coordinator of a release that writes
-- no heartbeat.
SELECT CAST(p.ID AS SIGNED) AS id,
       p.HOST AS host,
       CONCAT(@@hostname, ':', @@port) AS node,
       EXISTS (
           SELECT 1
           FROM coordinator_sessions s
           WHERE s.node = CONCAT(@@hostname, ':', @@port)
             AND s.connection_id = p.ID) AS registered
FROM information_schema.PROCESSLIST p
WHERE p.USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)
  AND p.DB = DATABASE()
ORDER BY p.ID
