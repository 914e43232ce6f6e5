-- The paused queues: since when, by whom, why.
SELECT queue, paused_at, CAST(paused_by AS CHAR) AS paused_by,
       CAST(pause_reason AS CHAR) AS pause_reason
FROM queue_policies
WHERE paused_at IS NOT NULL
ORDER BY queue
