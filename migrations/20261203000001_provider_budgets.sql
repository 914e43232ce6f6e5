-- Provider budgets and stored queue policies (DESIGN.md rules 11-13): what
-- every coordinator reads in its claim and write transactions, so that N
-- coordinators enforce one limit and agree on every resend.
-- Runs unchanged on MySQL 8.4 and MariaDB 10.11 (InnoDB; every table has a
-- primary key, as Galera and Group Replication require).

-- One row per provider: its budget and the GCRA state the claims update
-- under this row's lock, in the claim's own transaction.
CREATE TABLE providers (
    name             VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- Units per second (fractions allowed) and units at once.
    rate_per_second  DOUBLE NOT NULL,
    burst            INT UNSIGNED NOT NULL,
    -- Most jobs of its queues running with a live lease; NULL: no cap.
    max_in_flight    INT UNSIGNED NULL,
    -- Units a hand-out costs, by next_action.
    execute_cost     INT UNSIGNED NOT NULL DEFAULT 1,
    reconcile_cost   INT UNSIGNED NOT NULL DEFAULT 1,
    -- GCRA theoretical arrival time (DB clock): units may be spent while
    -- max(tat, now) + cost / rate <= now + burst / rate.
    tat              DATETIME(6) NOT NULL,
    -- An operator's pause: none, all, or sends (reconciles go on).
    pause            VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'none',
    pause_reason     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    -- A worker reported the provider's 429 / Retry-After: nothing is handed
    -- out before this (DB clock).
    throttled_until  DATETIME(6) NULL,
    throttle_reports BIGINT UNSIGNED NOT NULL DEFAULT 0,
    created_at       DATETIME(6) NOT NULL,
    updated_at       DATETIME(6) NOT NULL,
    updated_by       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (name),
    CONSTRAINT ck_providers_pause CHECK (pause IN ('none', 'all', 'sends')),
    CONSTRAINT ck_providers_budget CHECK (
        rate_per_second > 0 AND burst >= 1 AND execute_cost >= 1 AND reconcile_cost >= 1
        AND burst >= execute_cost AND burst >= reconcile_cost
        AND (max_in_flight IS NULL OR max_in_flight >= 1))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per queue with a stored resend policy or a provider. A queue
-- without a row dispatches to no provider (unlimited) and follows the
-- coordinators' --resend-window / --max-dispatches flags.
CREATE TABLE queue_policies (
    queue            VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The provider its jobs are sent to; a queue has at most one.
    provider         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL,
    -- The stored resend policy (DESIGN.md rule 6), both or neither.
    resend_window_us BIGINT UNSIGNED NULL,
    max_dispatches   INT UNSIGNED NULL,
    -- Sharing a provider's units between its queues (written by claims):
    -- when a claim of the queue last got units, and when one last found
    -- due jobs the budget held back.
    last_granted_at  DATETIME(6) NULL,
    last_short_at    DATETIME(6) NULL,
    updated_at       DATETIME(6) NOT NULL,
    updated_by       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (queue),
    KEY ix_queue_policies_provider (provider),
    CONSTRAINT fk_queue_policies_provider FOREIGN KEY (provider) REFERENCES providers (name),
    CONSTRAINT ck_queue_policies_resend CHECK ((resend_window_us IS NULL) = (max_dispatches IS NULL)),
    CONSTRAINT ck_queue_policies_values CHECK (
        (resend_window_us IS NULL OR resend_window_us > 0)
        AND (max_dispatches IS NULL OR max_dispatches >= 1))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Every operator change of a provider or a queue policy, with who and why,
-- written in the transaction of the change. Append-only.
CREATE TABLE policy_changes (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    -- provider:<name> or queue:<name>
    subject    VARCHAR(140) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    action     VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    operator   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    reason     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- JSON: the stored values after the change (before it, for a delete).
    detail     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    changed_at DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    KEY ix_policy_changes_subject (subject, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
