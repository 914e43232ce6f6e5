-- The key records of pruned jobs of the provider's queues ({queues}) for
-- the keys of {keys} that no job holds (holders_jobs.sql), locked with
-- {lock} for the same reason as jobs are.
SELECT k.job_id, CAST(k.queue AS CHAR) AS queue, CAST(k.operation_key AS CHAR) AS operation_key,
       CAST(k.final_state AS CHAR) AS state, k.attempt
FROM operation_keys k
WHERE k.queue IN ({queues}) AND k.operation_key IN ({keys})
{lock}
