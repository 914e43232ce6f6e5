-- A job's first observation: the flag a claim reads to know it must read
-- the job's observations (migrations/20261210000001_jobs_has_observations.sql),
-- set in the observation's transaction under the lock of lock_job.sql.
UPDATE jobs SET has_observations = 1 WHERE id = ?
