-- The number of this database among the databases a coordinator spreads
-- queues over (docs/database.md, "Queues on several databases"). Every job
-- id and event id a database hands out carries it in its high bits, so an
-- id names its database without a lookup table. One row, written by the
-- first coordinator that is given this database as shard N; a coordinator
-- given it under another number refuses to start. A database used alone
-- has no row (it is shard 0).
-- Runs unchanged on MySQL 8.4 and MariaDB 10.11 (a primary key, as Galera
-- and Group Replication require).
CREATE TABLE jobfence_shard (
    singleton  TINYINT UNSIGNED NOT NULL,
    shard      INT UNSIGNED NOT NULL,
    created_at DATETIME(6) NOT NULL,
    PRIMARY KEY (singleton),
    CONSTRAINT ck_jobfence_shard_singleton CHECK (singleton = 1)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
