-- Indexes for the operator side (JobAdmin, the pending-age gauges).
-- Runs unchanged on MySQL 8.4 and MariaDB 10.11.

-- Jobs by state, then queue; InnoDB appends the primary key, so entries are
-- in (state, queue, id) order. Serves: the oldest job of a pending state
-- (MIN(id) is one index dive), ListJobs filtered by state (keyset paging on
-- id), and the queue list of the gauges without touching succeeded rows.
CREATE INDEX ix_jobs_state_queue ON jobs (state, queue);

-- Takeovers and stale-write rejections over a time window (QueueStats):
-- a range scan of just those kinds, never of the whole append-only log.
CREATE INDEX ix_job_events_kind_created ON job_events (kind, created_at);
