-- The largest id of one table, to check it lies in the shard's range.
-- {table} is written in by shards.rs (jobs, job_events or policy_changes).
SELECT MAX(id) FROM {table}
