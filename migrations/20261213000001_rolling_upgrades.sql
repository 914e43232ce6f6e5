-- Rolling upgrades with no SQL by hand (docs/releases.md, docs/operating.md
-- "Upgrading"). Release 0.2.0. Runs unchanged on MySQL 8.4 and MariaDB
-- 10.11 (InnoDB; every table has a primary key, as Galera requires).
--
-- Older coordinators may run beside this migration: it only adds tables
-- that they never read.

-- What each migration from this one on says of the coordinators that do
-- not carry it (a release older than the migration): `may_serve` when they
-- may go on serving beside it (and be started again after a rollback),
-- `must_stop` when they must not. A coordinator refuses to start on a
-- database that applied a migration it does not know unless its row here
-- says `may_serve`. Every new migration inserts its own row.
CREATE TABLE schema_migration_notes (
    version            BIGINT NOT NULL,
    older_coordinators VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- Why, for the refusal's message and `jobfence migrate --check`.
    note               VARCHAR(1000) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (version),
    CONSTRAINT ck_schema_migration_notes_older CHECK (older_coordinators IN ('may_serve', 'must_stop'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Each running coordinator's heartbeat (written every few seconds): its
-- release and the newest migration it carries. A row whose last_seen_at
-- is older than the upgrade quiet period is a coordinator that stopped.
CREATE TABLE coordinators (
    name           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    release_version VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    schema_version BIGINT NOT NULL,
    host           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    started_at     DATETIME(6) NOT NULL,
    last_seen_at   DATETIME(6) NOT NULL,
    PRIMARY KEY (name),
    KEY ix_coordinators_last_seen (last_seen_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The database sessions of jobfence processes of this release or newer,
-- registered when each session connects (node: the server's host:port,
-- since a connection id is one server's). A session of the coordinators'
-- database user that is not registered here may be a coordinator of a
-- release that writes no heartbeat (0.1.0): while one is connected, newer
-- coordinators keep the behaviour it expects.
CREATE TABLE coordinator_sessions (
    node          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    connection_id BIGINT UNSIGNED NOT NULL,
    process       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    registered_at DATETIME(6) NOT NULL,
    PRIMARY KEY (node, connection_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Data that a newer release keeps differently from an older one, brought
-- forward by the newest coordinator once no older one has been seen for
-- the quiet period (the backfill). Until then every newer coordinator
-- keeps the older behaviour.
CREATE TABLE schema_transitions (
    name          VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The release whose coordinators keep the data the new way.
    release_version VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    opened_at     DATETIME(6) NOT NULL,
    -- NULL while older coordinators may still run (or ran again since).
    completed_at  DATETIME(6) NULL,
    completed_by  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    -- Rows the last backfill changed, and how many backfills ran.
    rows_changed  BIGINT UNSIGNED NULL,
    backfills     INT UNSIGNED NOT NULL DEFAULT 0,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- jobs.has_observations (migration 20261210000001): a coordinator of 0.1.0
-- records observations without setting it. A database with no job yet has
-- nothing to bring forward.
INSERT INTO schema_transitions (name, release_version, opened_at, completed_at, completed_by, backfills)
SELECT 'observations_flag', '0.2.0', UTC_TIMESTAMP(6),
       CASE WHEN EXISTS (SELECT 1 FROM jobs) THEN NULL ELSE UTC_TIMESTAMP(6) END,
       CASE WHEN EXISTS (SELECT 1 FROM jobs) THEN NULL ELSE 'migration (no jobs)' END,
       0;

INSERT INTO schema_migration_notes (version, older_coordinators, note)
VALUES (20261213000001, 'may_serve', 'adds the upgrade tables only; older coordinators never read them');
