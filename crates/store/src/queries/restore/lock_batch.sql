-- The next unfinished jobs after a job id (the batch's primary-key range),
-- oldest id first, locked until COMMIT. Terminal jobs (succeeded, failed,
-- cancelled) are left as they are. Binds: the last id done, the batch size.
SELECT id, queue, state, attempt, next_action
FROM jobs
WHERE id > ? AND state IN ('ready', 'running', 'manual_review')
ORDER BY id
LIMIT ?
FOR UPDATE
