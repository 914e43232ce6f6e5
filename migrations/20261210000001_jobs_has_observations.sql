-- Whether a job has observations, kept on its own row (docs/design.md rule
-- 7): a claim hands a job out with its observations, and reading them only
-- for the jobs that have some took a correlated EXISTS over
-- job_observations in every claim scan, about a third of the ready scan's
-- cost in the database (docs/benchmarks.md, "A lone worker's reads").
-- RecordObservation, the one way an observation is written, sets it in the
-- observation's own transaction, under the job's row lock; pruning deletes
-- a job's observations only with the job, so once set it stays true.
--
-- Stop coordinators older than this migration before applying it: one
-- would record observations without setting the flag, and the claims of
-- newer ones would hand the job out without them.
-- ADD COLUMN with a constant default is an instant change on MySQL 8.4 and
-- MariaDB 10.11; the same statements run on both. TINYINT, not TINYINT(1):
-- the driver reads the latter as a boolean, and the archive of pruned rows
-- (crates/store/src/archive.rs) writes every integer column as a number.
ALTER TABLE jobs
    ADD COLUMN has_observations TINYINT NOT NULL DEFAULT 0;

UPDATE jobs
SET has_observations = 1
WHERE id IN (SELECT job_id FROM job_observations);
