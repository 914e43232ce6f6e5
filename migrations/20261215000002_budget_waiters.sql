-- Long-polling Claims waiting for a provider's budget, across every
-- coordinator (docs/design.md rule 11, "Waiters take turns"): a Claim with
-- a wait that the budget held back is written here, under the provider's
-- row lock, and the units of the provider go to these waiters in the order
-- they came (`since`, the database clock) before any claim that does not
-- wait gets one. A row lives until its Claim is handed a job, stops
-- waiting for the budget, or lets `expires_at` pass (a waiter refreshes it
-- at each look; a crashed coordinator's waiters lapse on their own).
CREATE TABLE budget_waiters (
    provider   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    waiter     BIGINT UNSIGNED NOT NULL,
    queue      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    since      DATETIME(6) NOT NULL,
    expires_at DATETIME(6) NOT NULL,
    PRIMARY KEY (provider, waiter),
    KEY ix_budget_waiters_turn (provider, since, waiter)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The latest expiry of a provider's waiters: a claim reads the waiters
-- only while it is in the future (NULL: none ever waited).
ALTER TABLE providers
    ADD COLUMN waiters_until DATETIME(6) NULL;

INSERT INTO schema_migration_notes (version, older_coordinators, note)
VALUES (20261215000002, 'may_serve', 'adds a table and a nullable column; an older coordinator does not leave units for the waiters of other coordinators (its claims take what the budget allows, as before)');
