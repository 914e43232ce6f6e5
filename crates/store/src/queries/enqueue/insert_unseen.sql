-- Enqueue, the common case: the new jobs of a batch inserted without a
-- look-up first. A key some job already holds fails the statement with a
-- duplicate-key error before anything is written, and the batch falls
-- back to looking its keys up (insert.sql). A key whose job was pruned
-- keeps its key record (docs/design.md rule 14): that item is not
-- inserted, and answers as the pruned job.
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
WHERE NOT EXISTS (
    SELECT 1 FROM operation_keys k FORCE INDEX (PRIMARY)
    WHERE k.queue = t.queue AND k.operation_key = t.operation_key)
ORDER BY t.n
