-- A coordinator's heartbeat: its release and schema version, written every
-- few seconds. Binds: name, release, schema version, host, microseconds
-- since it started (its monotonic clock placed on the database's).
INSERT INTO coordinators (name, release_version, schema_version, host, started_at, last_seen_at)
VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    release_version = VALUES(release_version),
    schema_version = VALUES(schema_version),
    host = VALUES(host),
    started_at = VALUES(started_at),
    last_seen_at = VALUES(last_seen_at)
