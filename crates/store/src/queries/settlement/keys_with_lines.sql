-- Which of the batch's keys (a JSON array, read as a table: see
-- holders_jobs.sql) already have a line of the provider (the second
-- parameter), read with a shared lock: a line of one of them inserted by
-- another import at the same moment waits for this transaction, or this
-- one for it (a deadlock, run again), so two imports never both take a
-- key's first line for its only one.
SELECT STRAIGHT_JOIN DISTINCT CAST(l.operation_key AS CHAR) AS operation_key
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         k VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
JOIN settlement_lines l ON l.provider = ? AND l.operation_key = t.k
LOCK IN SHARE MODE
