-- The whole rows of the events of a pruning batch's jobs (a locking read,
-- so it sees exactly what the DELETE will). {ids}: as in jobs.sql.
SELECT * FROM job_events WHERE job_id IN ({ids}) ORDER BY job_id, id FOR UPDATE
