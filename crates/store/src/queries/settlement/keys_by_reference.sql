-- The operation keys of the jobs, then of the key records (pruned jobs),
-- of the provider's queues whose recorded provider reference is one of
-- the batch's: how a line that names no operation key is matched.
-- Parameters, each part: a JSON array of the provider's queues and a JSON
-- array of the references, read as tables (as holders_jobs.sql reads its
-- keys); every (queue, reference) pair is one lookup in the index on
-- (queue, provider_reference) of each table (migration 20261215000001),
-- so the match reads the rows it finds, not every job of the queues.
-- `src` says where a row came from (0 a job, 1 a key record): the caller
-- takes a reference's job before a key record, and of two jobs the oldest.
SELECT STRAIGHT_JOIN 0 AS src, j.id AS job_id,
       CAST(j.provider_reference AS CHAR) AS provider_reference,
       CAST(j.queue AS CHAR) AS queue, CAST(j.operation_key AS CHAR) AS operation_key
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         q VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS qs
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
         r VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
JOIN jobs j FORCE INDEX (ix_jobs_provider_reference)
  ON j.queue = qs.q AND j.provider_reference = t.r
UNION ALL
SELECT STRAIGHT_JOIN 1, k.job_id, CAST(k.provider_reference AS CHAR),
       CAST(k.queue AS CHAR), CAST(k.operation_key AS CHAR)
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         q VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS qs
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
         r VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
JOIN operation_keys k FORCE INDEX (ix_operation_keys_provider_reference)
  ON k.queue = qs.q AND k.provider_reference = t.r
