-- The key records of pruned jobs {ids} that hold keys of a batch's lines,
-- locked for the same reason as their jobs would be (lock_finished_jobs.sql).
SELECT job_id FROM operation_keys
WHERE job_id IN ({ids})
ORDER BY job_id
FOR UPDATE
