-- The observations of several jobs, oldest first. {ids} is a list of
-- placeholders, one per job.
SELECT {observation_columns} FROM job_observations WHERE job_id IN ({ids}) ORDER BY id
