-- The jobs of a batch's (queue, operation_key) pairs that exist, with their
-- stored request digest (tells a duplicate Enqueue from a conflicting one).
-- One unique-index lookup per key.
SELECT {job_columns}, HEX(jobs.request_digest) AS request_digest_hex
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         want_queue VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         want_key   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.operation_key')) AS t
STRAIGHT_JOIN jobs FORCE INDEX (uq_jobs_queue_operation_key) ON jobs.queue = t.want_queue AND jobs.operation_key = t.want_key
