-- Who holds each operation key of {keys} in the provider's queues
-- ({queues}): a job, else its key record if the job was pruned. A key is
-- unique per queue; the provider's queues are distinct queues, so a key
-- names at most one job among them unless two of its queues used it.
SELECT 'job' AS kind, j.id AS job_id, CAST(j.queue AS CHAR) AS queue,
       CAST(j.operation_key AS CHAR) AS operation_key, CAST(j.state AS CHAR) AS state,
       j.attempt, j.payload
FROM jobs j
WHERE j.queue IN ({queues}) AND j.operation_key IN ({keys})
UNION ALL
SELECT 'key', k.job_id, CAST(k.queue AS CHAR), CAST(k.operation_key AS CHAR),
       CAST(k.final_state AS CHAR), k.attempt, NULL
FROM operation_keys k
WHERE k.queue IN ({queues}) AND k.operation_key IN ({keys})
