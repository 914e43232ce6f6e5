-- Sessions of a jobfence process (0.2.0 or newer) say they are one
-- (migrations/20261213000001_rolling_upgrades.sql): a session of the
-- coordinators' user that is not here may be an older coordinator.
-- `{rows}` of (?, ?, ?, UTC_TIMESTAMP(6)) binding the session's server
-- (@@hostname:@@port), its connection id, and the process's name.
INSERT INTO coordinator_sessions (node, connection_id, process, registered_at)
VALUES {rows}
ON DUPLICATE KEY UPDATE
    process = VALUES(process),
    registered_at = VALUES(registered_at)
