-- jobfence schema. Runs unchanged on MySQL 8.4 and MariaDB 10.11 (InnoDB).
-- All times are UTC from the database clock (UTC_TIMESTAMP(6)).

CREATE TABLE jobs (
    id                  BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    queue               VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- Business identity sent to the provider as idempotency key. Never
    -- derived from attempt.
    operation_key       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- SHA-256 of the enqueue payload: tells a duplicate enqueue from a
    -- conflicting one.
    request_digest      BINARY(32) NOT NULL,
    payload             MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state               VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- Fencing token: +1 on every claim and takeover, under the row lock.
    attempt             BIGINT UNSIGNED NOT NULL DEFAULT 0,
    next_action         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'execute',
    run_at              DATETIME(6) NOT NULL,
    lease_until         DATETIME(6) NULL,
    lease_owner         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    first_dispatched_at DATETIME(6) NULL,
    dispatch_count      INT UNSIGNED NOT NULL DEFAULT 0,
    provider_reference  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    result              MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    last_error          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    state_reason        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at          DATETIME(6) NOT NULL,
    updated_at          DATETIME(6) NOT NULL,
    finished_at         DATETIME(6) NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_jobs_queue_operation_key (queue, operation_key),
    -- Claim scan 1: due ready jobs of a queue, oldest run_at first.
    KEY ix_jobs_claim_ready (queue, state, run_at),
    -- Claim scan 2: running jobs of a queue whose lease expired.
    KEY ix_jobs_claim_expired (queue, state, lease_until),
    CONSTRAINT ck_jobs_state CHECK (state IN ('ready', 'running', 'succeeded', 'failed', 'manual_review', 'cancelled')),
    CONSTRAINT ck_jobs_next_action CHECK (next_action IN ('execute', 'reconcile'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE job_observations (
    id                 BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    job_id             BIGINT UNSIGNED NOT NULL,
    -- The attempt the reporter held; stale attempts are kept on purpose.
    attempt            BIGINT UNSIGNED NOT NULL,
    source             VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    outcome            VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    provider_reference VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    body               MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    dedup_key          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    recorded_at        DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_job_observations_dedup (job_id, dedup_key),
    CONSTRAINT fk_job_observations_job FOREIGN KEY (job_id) REFERENCES jobs (id),
    CONSTRAINT ck_job_observations_source CHECK (source IN ('worker', 'webhook', 'reconciler', 'operator')),
    CONSTRAINT ck_job_observations_outcome CHECK (outcome IN ('succeeded', 'pending', 'failed', 'not_found', 'unknown'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Append-only: every transition and every rejected stale write, written in
-- the same transaction as the change. Doubles as the outbox read by cursor
-- (id ascending).
CREATE TABLE job_events (
    id                BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    job_id            BIGINT UNSIGNED NOT NULL,
    queue             VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The attempt that caused the event (for a rejection: the one presented).
    attempt           BIGINT UNSIGNED NOT NULL,
    kind              VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    from_state        VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL,
    to_state          VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL,
    -- The job's attempt when the event was written.
    current_attempt   BIGINT UNSIGNED NOT NULL,
    -- SHA-256 of the fenced call that was applied: recognises an exact replay.
    request_digest    BINARY(32) NULL,
    detail            TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at        DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    KEY ix_job_events_job_attempt (job_id, attempt),
    KEY ix_job_events_queue (queue, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
