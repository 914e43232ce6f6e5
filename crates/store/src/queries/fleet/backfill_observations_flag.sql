-- The observations flag brought forward (migration 20261210000001): a
-- coordinator of 0.1.0 recorded observations without setting it.
UPDATE jobs
SET has_observations = 1
WHERE has_observations = 0
  AND id IN (SELECT job_id FROM job_observations)
