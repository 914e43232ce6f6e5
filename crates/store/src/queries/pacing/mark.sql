-- Where a paced run of background work starts counting the others'
-- progress (crates/store/src/pacing.rs): the largest job event id so far,
-- 0 with none. One dive into the primary key.
SELECT CAST(COALESCE(MAX(id), 0) AS UNSIGNED) FROM job_events
