-- Pruning: the largest event id of the batch's locked jobs, to raise the
-- events feed's mark to. {ids}: the comma-separated list of locked jobs.
SELECT MAX(id) FROM job_events WHERE job_id IN ({ids})
