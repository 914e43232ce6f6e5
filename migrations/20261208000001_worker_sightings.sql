-- Workers seen across coordinators (docs/operating.md "Workers"): each
-- coordinator keeps in memory the workers that called it (a Claim, a
-- Takeover, or a Complete or Fail asking for its next job: the calls that
-- name a worker_id) and writes what it saw every few seconds, one row per
-- worker and coordinator, in one statement. Nothing on the call's path
-- touches this table. Readers merge a worker's rows: its latest call, the
-- coordinator that served it, its calls per minute summed. Rows are kept a
-- day after their last call. Runs unchanged on MySQL 8.4 and MariaDB 10.11.
CREATE TABLE worker_sightings (
    worker_id         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The coordinator's name (`jobfence serve --coordinator-name`).
    coordinator       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The client and its version, from the call's user-agent
    -- (`jobfence-python/0.1.0`, `grpc-go/1.59.0`, ...).
    client            VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The queue of its latest call.
    queue             VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    first_seen_at     DATETIME(6) NOT NULL,
    last_call_at      DATETIME(6) NOT NULL,
    -- Its calls to this coordinator in the minute before the write.
    calls_last_minute INT UNSIGNED NOT NULL,
    PRIMARY KEY (worker_id, coordinator),
    KEY ix_worker_sightings_last_call (last_call_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
