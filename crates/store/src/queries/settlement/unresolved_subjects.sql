-- Which of the subjects (a JSON array, read as a table: see
-- holders_jobs.sql) have an exception of the provider (the second
-- parameter) not resolved: only those need their exceptions looked at
-- when nothing new is raised.
SELECT STRAIGHT_JOIN DISTINCT CAST(e.subject AS CHAR) AS subject
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         s VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
JOIN settlement_exceptions e ON e.provider = ? AND e.subject = t.s AND e.state <> 'resolved'
