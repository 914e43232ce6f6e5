-- Enqueue: the new jobs of a batch, `ready`
-- with next_action `execute`, each due after its delay (DB clock). Keys
-- taken meanwhile by a concurrent Enqueue fail the statement with a
-- duplicate-key error, and the caller runs the batch again. The guard
-- below is empty after a look-up found the keys free; without a look-up (the common
-- case of a small batch) it leaves out the keys with a key record (a
-- pruned job answers as itself, docs/design.md rule 14), and a key a job
-- holds fails the statement before anything is written: the batch then
-- looks its keys up.
--
-- Each job's start round (rule 18): one round after the last its
-- (queue, fairness key, priority) was given (`fairness_keys`), or the
-- queue's frontier (@jf_frontiers, set by frontiers.sql just before) when
-- that is later (a key with nothing pending), then one more per earlier
-- due item of the same line in the batch; moved by the priority's head
-- start (100 rounds a step from 5). A delayed job is UNPLACED
-- (-2^62, below the claim scan's range) until a claim places it when it
-- comes due. Concurrent batches of one key may give two jobs the same
-- round: they then go in due-time order, as any tie.
INSERT INTO jobs (
    queue, operation_key, request_digest, payload, state, attempt, next_action,
    run_at, dispatch_count, created_at, updated_at, priority, fairness_key, fair_round
)
WITH t AS (
    SELECT * FROM JSON_TABLE(?, '$[*]' COLUMNS (
         n              FOR ORDINALITY,
         queue          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         operation_key  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.operation_key',
         request_digest CHAR(64) CHARACTER SET ascii COLLATE ascii_bin PATH '$.request_digest',
         payload        MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.payload',
         delay_us       BIGINT PATH '$.delay_us',
         priority       TINYINT UNSIGNED PATH '$.priority',
         fairness_key   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.fairness_key')) AS items
)
SELECT t.queue, t.operation_key, UNHEX(t.request_digest), t.payload, 'ready', 0, 'execute',
       DATE_ADD(UTC_TIMESTAMP(6), INTERVAL t.delay_us MICROSECOND), 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
       t.priority, t.fairness_key,
       IF(t.delay_us > 0, -4611686018427387904,
          GREATEST(COALESCE(fk.last_round, 0),
                   CAST(JSON_EXTRACT(@jf_frontiers, CONCAT('$."', t.queue, '"')) AS SIGNED) - 1)
            + CAST(ROW_NUMBER() OVER (PARTITION BY t.queue, t.fairness_key, t.priority, t.delay_us > 0
                                      ORDER BY t.n) AS SIGNED)
            - (CAST(t.priority AS SIGNED) - 5) * 100)
FROM t
LEFT JOIN fairness_keys fk FORCE INDEX (PRIMARY)
  ON fk.queue = t.queue AND fk.fairness_key = t.fairness_key AND fk.priority = t.priority
{guard}
ORDER BY t.n
