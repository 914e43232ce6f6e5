-- The unfinished jobs by state, with the highest attempt among them (what
-- `restore fence` would move).
SELECT CAST(state AS CHAR) AS state, COUNT(*) AS jobs, MAX(attempt) AS highest
FROM jobs
WHERE state IN ('ready', 'running', 'manual_review')
GROUP BY state
ORDER BY state
