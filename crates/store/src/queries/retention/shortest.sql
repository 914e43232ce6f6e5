-- The shortest job retention any queue stores (NULL: none stores one): the
-- first bound of the candidates' scan (candidates.sql).
SELECT CAST(MIN(job_retention_us) AS SIGNED) FROM queue_policies
