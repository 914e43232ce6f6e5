-- The key record of a pruned job, by its id (ix_operation_keys_job).
SELECT job_id, queue, operation_key, final_state, attempt, dispatch_count,
       provider_reference, created_at, finished_at, pruned_at
FROM operation_keys
WHERE job_id = ?
