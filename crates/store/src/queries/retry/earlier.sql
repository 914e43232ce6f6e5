-- The new operation key an earlier RetryAsNewOperation reserved for job ?
-- (the detail of its `retried_as_new_operation` event), read under the
-- job's row lock: a job is tried again as one new operation at most.
SELECT CAST(detail AS CHAR) FROM job_events
WHERE job_id = ? AND kind = 'retried_as_new_operation'
ORDER BY id
LIMIT 1
