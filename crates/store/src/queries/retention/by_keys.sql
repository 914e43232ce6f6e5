-- The key records of a batch's (queue, operation_key) pairs, with their
-- stored request digest: the keys of pruned jobs (one primary-key lookup
-- per key).
SELECT k.job_id, k.queue, k.operation_key, k.final_state, k.attempt, k.dispatch_count,
       k.provider_reference, k.created_at, k.finished_at, k.pruned_at,
       HEX(k.request_digest) AS request_digest_hex
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         want_queue VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         want_key   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.operation_key')) AS t
STRAIGHT_JOIN operation_keys k FORCE INDEX (PRIMARY)
  ON k.queue = t.want_queue AND k.operation_key = t.want_key
