-- Pruning: the key record of each locked job, written before the job row
-- goes, in the same transaction (DESIGN.md rule 14). Idempotent: a record
-- that exists already (a batch run again) is left as it is.
INSERT INTO operation_keys (
    queue, operation_key, request_digest, job_id, final_state, attempt,
    dispatch_count, provider_reference, created_at, finished_at, pruned_at
)
SELECT queue, operation_key, request_digest, id, state, attempt,
       dispatch_count, provider_reference, created_at, finished_at, UTC_TIMESTAMP(6)
FROM jobs
WHERE id IN ({ids}) AND state IN ('succeeded', 'failed', 'cancelled') AND finished_at IS NOT NULL
ON DUPLICATE KEY UPDATE operation_keys.job_id = operation_keys.job_id
