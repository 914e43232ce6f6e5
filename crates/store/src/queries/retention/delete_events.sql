-- Pruning: the events of the batch's locked jobs. {ids}: the
-- comma-separated list of locked jobs.
DELETE FROM job_events WHERE job_id IN ({ids})
