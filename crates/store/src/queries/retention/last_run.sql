-- When the last pruning run ended, in microseconds since the Unix epoch.
SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', last_run_at) AS SIGNED)
FROM pruning_marks WHERE singleton = 1
