-- The (state, queue) pairs that have pending jobs. GROUP BY on the leftmost
-- columns of ix_jobs_state_queue: a loose index scan, one dive per pair,
-- however many jobs there are.
SELECT state, queue
FROM jobs
WHERE state IN ('ready', 'running', 'manual_review')
GROUP BY state, queue
