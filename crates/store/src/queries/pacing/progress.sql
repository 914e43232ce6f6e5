-- The others' progress since the last count, for pacing background work
-- (crates/store/src/pacing.rs): the job events committed with an id above
-- the largest counted so far (binds it), and the largest of them. Every
-- claim, write-back, lease renewal and enqueue of any coordinator of the
-- database adds events; one range read of the primary key, as long as the
-- events of one stretch of time.
SELECT COUNT(*), MAX(id) FROM job_events WHERE id > ?
