-- Settlement (docs/design.md rule 15): the provider's own report of the
-- refunds it made, matched by operation key against the jobs and the key
-- records of the provider's queues. Runs unchanged on MySQL 8.4 and
-- MariaDB 10.11 (InnoDB; every table has a primary key).

-- How a provider's report is read: which column holds each field (one of
-- two presets, or columns of the operator's choosing), and how long a
-- refund may take to appear in a report (the lag before a succeeded job
-- without a refund line is an exception).
CREATE TABLE settlement_settings (
    provider                 VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- 'fake', 'stripe', or NULL for the columns below as the operator set them.
    preset                   VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
    provider_reference_column VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    operation_key_column     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    amount_column            VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    amount_unit              VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    currency_column          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    status_column            VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    created_column           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    created_format           VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    lag_us                   BIGINT UNSIGNED NOT NULL,
    updated_at               DATETIME(6) NOT NULL,
    updated_by               VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (provider),
    CONSTRAINT fk_settlement_settings_provider FOREIGN KEY (provider) REFERENCES providers (name)
        ON DELETE CASCADE,
    CONSTRAINT ck_settlement_settings_units CHECK (
        amount_unit IN ('minor', 'major') AND created_format IN ('unix', 'rfc3339'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Where a job's amount and currency are in its payload (JSON pointers,
-- RFC 6901), per queue: without them amounts are not compared.
ALTER TABLE queue_policies
    ADD COLUMN amount_pointer   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD COLUMN currency_pointer VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;

-- The periods a provider's imported reports covered, [period_start,
-- period_end) in UTC. The same period imported again is one row.
CREATE TABLE settlement_periods (
    id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    provider         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    period_start     DATETIME(6) NOT NULL,
    period_end       DATETIME(6) NOT NULL,
    first_imported_at DATETIME(6) NOT NULL,
    last_imported_at DATETIME(6) NOT NULL,
    last_imported_by VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_settlement_periods (provider, period_start, period_end),
    CONSTRAINT ck_settlement_periods_order CHECK (period_end > period_start)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per refund the provider reported, by its own id: a refund seen
-- again with a new status (pending, then succeeded or failed) updates its
-- row. decided_at is NULL while the row's key has not been matched since
-- the row last changed: an import cut off midway leaves such rows, and the
-- next import of the provider matches them first.
CREATE TABLE settlement_lines (
    id                 BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    provider           VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    provider_reference VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The merchant reference as reported (the operation key); NULL when
    -- the report has none (then matched by the job's provider reference).
    operation_key      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    amount_minor       BIGINT NOT NULL,
    currency           CHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status             VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    refund_created_at  DATETIME(6) NOT NULL,
    -- The job the line was matched to (a pruned job's id stays here).
    job_id             BIGINT UNSIGNED NULL,
    first_seen_at      DATETIME(6) NOT NULL,
    updated_at         DATETIME(6) NOT NULL,
    decided_at         DATETIME(6) NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_settlement_lines_reference (provider, provider_reference),
    KEY ix_settlement_lines_key (provider, operation_key),
    KEY ix_settlement_lines_job (job_id),
    KEY ix_settlement_lines_undecided (provider, decided_at),
    CONSTRAINT ck_settlement_lines_status CHECK (status IN ('pending', 'succeeded', 'failed', 'canceled')),
    CONSTRAINT ck_settlement_lines_amount CHECK (amount_minor > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- What a person must look at: one row per provider, kind and subject (the
-- operation key, or the provider reference of a refund with no key).
CREATE TABLE settlement_exceptions (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    provider   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kind       VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    severity   VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    subject    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    job_id     BIGINT UNSIGNED NULL,
    detail     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state      VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    opened_at  DATETIME(6) NOT NULL,
    updated_at DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_settlement_exceptions (provider, kind, subject),
    KEY ix_settlement_exceptions_state (state, severity),
    KEY ix_settlement_exceptions_job (job_id),
    CONSTRAINT ck_settlement_exceptions_state CHECK (state IN ('open', 'acknowledged', 'resolved')),
    CONSTRAINT ck_settlement_exceptions_severity CHECK (severity IN ('critical', 'warning'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Every change of an exception's life, with who and why. Append-only.
CREATE TABLE settlement_exception_actions (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    exception_id BIGINT UNSIGNED NOT NULL,
    action       VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    operator     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    note         TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    acted_at     DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    KEY ix_settlement_exception_actions (exception_id, id),
    CONSTRAINT fk_settlement_exception_actions FOREIGN KEY (exception_id)
        REFERENCES settlement_exceptions (id),
    CONSTRAINT ck_settlement_exception_actions CHECK (
        action IN ('opened', 'reopened', 'acknowledged', 'resolved'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A settlement report's line kept as evidence on its job (source
-- 'settlement'): the observation sources gain one.
ALTER TABLE job_observations DROP CONSTRAINT ck_job_observations_source;
ALTER TABLE job_observations ADD CONSTRAINT ck_job_observations_source
    CHECK (source IN ('worker', 'webhook', 'reconciler', 'operator', 'settlement'));
