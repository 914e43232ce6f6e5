-- Key records past their own retention (expired_keys.sql), by job id.
-- {ids}: a comma-separated list of job ids.
DELETE FROM operation_keys WHERE job_id IN ({ids})
