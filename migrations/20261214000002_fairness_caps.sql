-- Caps per fairness key of a provider's budget (docs/design.md rule 18):
-- at most a share of the provider's rate for one key while other keys
-- have due jobs, and at most so many jobs of one key in flight. NULL: no
-- cap.
ALTER TABLE providers
    ADD COLUMN key_share             DOUBLE NULL,
    ADD COLUMN max_in_flight_per_key INT UNSIGNED NULL;

-- The theoretical arrival time of each key's share of a provider's rate
-- (GCRA, as `providers.tat`), written by the claims that spend it, under
-- the provider's row lock.
CREATE TABLE fairness_key_budgets (
    provider     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fairness_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    tat          DATETIME(6) NOT NULL,
    PRIMARY KEY (provider, fairness_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT INTO schema_migration_notes (version, older_coordinators, note)
VALUES (20261214000002, 'may_serve', 'adds nullable columns and a table; an older coordinator ignores the caps per key (it hands out within the provider''s budget only)');
