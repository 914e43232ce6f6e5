-- Retention (DESIGN.md rule 14): finished jobs are pruned, their operation
-- keys are not. Runs unchanged on MySQL 8.4 and MariaDB 10.11 (InnoDB;
-- every table has a primary key, as Galera and Group Replication require).

-- What a pruned job leaves behind: enough to answer a retried Enqueue of
-- its key exactly (same job id, created=false, the final state and the
-- provider's reference; OPERATION_KEY_CONFLICT for another payload) and a
-- late write naming its id (JOB_PRUNED). Written by the pruner with
-- INSERT … SELECT from the job row in the transaction that deletes it.
CREATE TABLE operation_keys (
    queue              VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    operation_key      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- SHA-256 of the enqueue payload, as in jobs.request_digest.
    request_digest     BINARY(32) NOT NULL,
    job_id             BIGINT UNSIGNED NOT NULL,
    -- succeeded, failed or cancelled: only terminal jobs are pruned.
    final_state        VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The job's last attempt and dispatch count when it finished.
    attempt            BIGINT UNSIGNED NOT NULL,
    dispatch_count     INT UNSIGNED NOT NULL,
    provider_reference VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at         DATETIME(6) NOT NULL,
    finished_at        DATETIME(6) NOT NULL,
    pruned_at          DATETIME(6) NOT NULL,
    PRIMARY KEY (queue, operation_key),
    KEY ix_operation_keys_job (job_id),
    -- The key records' own retention (when one is set).
    KEY ix_operation_keys_finished (finished_at),
    CONSTRAINT ck_operation_keys_state CHECK (final_state IN ('succeeded', 'failed', 'cancelled'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The pruner's candidate scan: terminal jobs, oldest finished first, one
-- range per state (the claim scans' indexes lead with the queue).
CREATE INDEX ix_jobs_finished ON jobs (state, finished_at);

-- Per-queue retention of finished jobs (NULL: the coordinator's default).
ALTER TABLE queue_policies ADD COLUMN job_retention_us BIGINT UNSIGNED NULL;

-- What the pruner has removed, for the events feed: every event id up to
-- events_pruned_through may be gone, so a consumer whose cursor is below it
-- is refused (EVENTS_CURSOR_PRUNED) instead of silently skipping. One row,
-- raised in the transaction that deletes events.
CREATE TABLE pruning_marks (
    singleton             TINYINT UNSIGNED NOT NULL,
    events_pruned_through BIGINT UNSIGNED NOT NULL DEFAULT 0,
    -- The last run that finished without an error (DB clock).
    last_run_at           DATETIME(6) NULL,
    PRIMARY KEY (singleton),
    CONSTRAINT ck_pruning_marks_singleton CHECK (singleton = 1)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT INTO pruning_marks (singleton, events_pruned_through, last_run_at) VALUES (1, 0, NULL);
