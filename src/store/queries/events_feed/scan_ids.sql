-- The next event ids after the cursor, by primary key, with the time of
-- this read (session clock, the one INNODB_TRX.trx_started uses).
SELECT id, NOW(6) AS read_at
FROM job_events
WHERE id > ?
ORDER BY id
LIMIT ?
