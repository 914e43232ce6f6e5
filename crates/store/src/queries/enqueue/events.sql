-- The `enqueued` event of each job of a batch just inserted, found by its
-- (queue, operation_key) in the same transaction (their ids are not known
-- until then). Under READ COMMITTED the read of `jobs` takes no locks.
INSERT INTO job_events (
    job_id, queue, attempt, kind, from_state, to_state, current_attempt,
    request_digest, detail, created_at
)
SELECT jobs.id, jobs.queue, 0, 'enqueued', NULL, 'ready', 0, NULL, NULL, jobs.created_at
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         want_queue VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         want_key   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.operation_key')) AS t
STRAIGHT_JOIN jobs FORCE INDEX (uq_jobs_queue_operation_key)
  ON jobs.queue = t.want_queue AND jobs.operation_key = t.want_key
