-- A session of a jobfence process (0.2.0 or newer) says it is one, when it
-- connects (migrations/20261213000001_rolling_upgrades.sql): a session of
-- the coordinators' user that is not here may be an older coordinator.
-- Bind: the process's name (a coordinator's --coordinator-name).
INSERT INTO coordinator_sessions (node, connection_id, process, registered_at)
VALUES (CONCAT(@@hostname, ':', @@port), CONNECTION_ID(), ?, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    process = VALUES(process),
    registered_at = VALUES(registered_at)
