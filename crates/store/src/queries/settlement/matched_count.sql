-- Succeeded jobs and key records of the provider's queues {queues} whose
-- key has exactly one settled line.
SELECT COUNT(*) AS n FROM (
    SELECT l.operation_key
    FROM settlement_lines l
    WHERE l.provider = ? AND l.status = 'succeeded' AND l.operation_key IS NOT NULL
    GROUP BY l.operation_key
    HAVING COUNT(*) = 1
) AS once
WHERE EXISTS (
    SELECT 1 FROM jobs j
    WHERE j.queue IN ({queues}) AND j.operation_key = once.operation_key AND j.state = 'succeeded')
   OR EXISTS (
    SELECT 1 FROM operation_keys k
    WHERE k.queue IN ({queues}) AND k.operation_key = once.operation_key
      AND k.final_state = 'succeeded')
