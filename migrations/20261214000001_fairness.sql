-- Fair hand-out (docs/design.md rule 18): a job's priority and fairness
-- key, and its place in the queue's fair order.
--
-- `fair_round` is the job's start round under start-time fair queuing:
-- the n-th pending job of a (fairness key, priority) gets the round after
-- the (n-1)-th, and a key with nothing pending starts at the queue's
-- frontier (the highest round handed out), so a key with 10 jobs is not
-- behind a key with 50,000. A priority above the default moves the job
-- 100 rounds ahead per step, one below it 100 rounds back: urgent jobs go
-- next, and a low one still leaves once the frontier reaches it. Claims
-- read due ready jobs in (fair_round, run_at) order. Jobs written before
-- this migration, and by older coordinators, are round 0: they keep
-- their due-time order and go first.
ALTER TABLE jobs
    ADD COLUMN priority     TINYINT UNSIGNED NOT NULL DEFAULT 5,
    -- '' when the job has none: such jobs share one key of their queue.
    ADD COLUMN fairness_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    ADD COLUMN fair_round   BIGINT NOT NULL DEFAULT 0;

-- The claim scan's fair order: due ready jobs of a queue, lowest round
-- first (run_at read from the index, so jobs not yet due are passed over
-- without reading their rows); and the frontier, the highest round of a
-- queue's jobs in one state, one seek from the end of the range.
CREATE INDEX ix_jobs_fair ON jobs (queue, state, fair_round, run_at);

-- The last start round given to each (queue, fairness key, priority): the
-- next job of the key starts one round later, or at the frontier when
-- that is later. A row behind the frontier means the same as no row.
CREATE TABLE fairness_keys (
    queue        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fairness_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    priority     TINYINT UNSIGNED NOT NULL,
    last_round   BIGINT NOT NULL,
    PRIMARY KEY (queue, fairness_key, priority)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT INTO schema_migration_notes (version, older_coordinators, note)
VALUES (20261214000001, 'may_serve', 'adds columns with defaults, an index and a table; older coordinators enqueue at round 0 and claim in due-time order');
