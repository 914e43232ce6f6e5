-- The key records of pruned jobs of the provider's queues ({queues}) for
-- the keys that no job holds (holders_jobs.sql): the parameter is a JSON
-- array of them, read as a table as there. Locked with {lock} for the
-- same reason as jobs are.
SELECT STRAIGHT_JOIN k.job_id, CAST(k.queue AS CHAR) AS queue,
       CAST(k.operation_key AS CHAR) AS operation_key,
       CAST(k.final_state AS CHAR) AS state, k.attempt
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         k VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
JOIN operation_keys k ON k.queue IN ({queues}) AND k.operation_key = t.k
{lock}
