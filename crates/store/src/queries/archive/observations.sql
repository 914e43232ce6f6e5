-- The whole rows of the observations of a pruning batch's jobs (a locking
-- read, so it sees exactly what the DELETE will). {ids}: as in jobs.sql.
SELECT * FROM job_observations WHERE job_id IN ({ids}) ORDER BY job_id, id FOR UPDATE
