-- The columns of the archived tables that hold bytes, not text: a
-- `utf8mb4_bin` text column looks binary to the driver, so the schema
-- says which is which.
SELECT CAST(table_name AS CHAR), CAST(column_name AS CHAR) FROM information_schema.columns
WHERE table_schema = DATABASE() AND table_name IN ('jobs', 'job_observations', 'job_events')
  AND data_type IN ('binary', 'varbinary', 'tinyblob', 'blob', 'mediumblob', 'longblob')
