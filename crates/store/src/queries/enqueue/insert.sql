-- Enqueue: the new jobs of a batch, `ready`
-- with next_action `execute`, each due after its delay (DB clock). Keys
-- taken meanwhile by a concurrent Enqueue fail the statement with a
-- duplicate-key error, and the caller runs the batch again. The guard
-- below is empty after a look-up found the keys free; without a look-up (the common
-- case of a small batch) it leaves out the keys with a key record (a
-- pruned job answers as itself, docs/design.md rule 14), and a key a job
-- holds fails the statement before anything is written: the batch then
-- looks its keys up.
INSERT INTO jobs (
    queue, operation_key, request_digest, payload, state, attempt, next_action,
    run_at, dispatch_count, created_at, updated_at
)
SELECT t.queue, t.operation_key, UNHEX(t.request_digest), t.payload, 'ready', 0, 'execute',
       DATE_ADD(UTC_TIMESTAMP(6), INTERVAL t.delay_us MICROSECOND), 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         n              FOR ORDINALITY,
         queue          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         operation_key  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.operation_key',
         request_digest CHAR(64) CHARACTER SET ascii COLLATE ascii_bin PATH '$.request_digest',
         payload        MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.payload',
         delay_us       BIGINT PATH '$.delay_us')) AS t
{guard}
ORDER BY t.n
