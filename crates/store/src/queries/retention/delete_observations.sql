-- Pruning: the observations of the batch's locked jobs. {ids}: the
-- comma-separated list of locked jobs.
DELETE FROM job_observations WHERE job_id IN ({ids})
