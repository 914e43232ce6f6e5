-- Pruning: the key record of each locked job, written before the job row
-- goes, in the same transaction (docs/design.md rule 14). Idempotent: a record
-- that exists already (a batch run again) is left as it is and not
-- inserted, so the statement's row count is the records it wrote (the
-- driver counts matched rows, docs/design.md rule 10: an ON DUPLICATE KEY
-- no-op alone would count as one); the ON DUPLICATE KEY clause stays for a
-- record another pruner wrote meanwhile.
INSERT INTO operation_keys (
    queue, operation_key, request_digest, job_id, final_state, attempt,
    dispatch_count, provider_reference, created_at, finished_at, pruned_at
)
SELECT j.queue, j.operation_key, j.request_digest, j.id, j.state, j.attempt,
       j.dispatch_count, j.provider_reference, j.created_at, j.finished_at, UTC_TIMESTAMP(6)
FROM jobs j
WHERE j.id IN ({ids}) AND j.state IN ('succeeded', 'failed', 'cancelled')
  AND j.finished_at IS NOT NULL
  AND NOT EXISTS (
    SELECT 1 FROM operation_keys k
    WHERE k.queue = j.queue AND k.operation_key = j.operation_key
  )
ON DUPLICATE KEY UPDATE operation_keys.job_id = operation_keys.job_id
