-- The key records of pruned jobs of the provider's queues for the keys
-- that no job holds (holders_jobs.sql): the same two parameters, the
-- queues and the keys as JSON arrays, joined by equality to the key
-- records' primary key (queue, operation_key) as there. Locked with
-- {lock} for the same reason as jobs are.
SELECT STRAIGHT_JOIN k.job_id, CAST(k.queue AS CHAR) AS queue,
       CAST(k.operation_key AS CHAR) AS operation_key,
       CAST(k.final_state AS CHAR) AS state, k.attempt,
       CAST(k.provider_reference AS CHAR) AS provider_reference
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         q VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS qs
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
         k VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
JOIN operation_keys k FORCE INDEX (PRIMARY)
  ON k.queue = qs.q AND k.operation_key = t.k
{lock}
