-- The end of a pruning run, read by the retention gauges of every
-- coordinator.
UPDATE pruning_marks SET last_run_at = UTC_TIMESTAMP(6) WHERE singleton = 1
