-- The largest event id allocated so far, committed or not: one dive into
-- the primary key.
SELECT MAX(id) FROM job_events
