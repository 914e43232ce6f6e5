-- RecordObservation's first statement: the job's row, locked (a job's
-- queue never changes; the scope check reads it), and whether it has
-- observations yet: its first one sets `has_observations` on the row, in
-- this transaction, so the lock is exclusive (in share mode, two first
-- observations of one job would each wait for the other's share to write
-- the flag: a deadlock). Taken before the observation is inserted, so the
-- pruner, which locks the job's row and then deletes its observations,
-- never waits for an observation whose transaction waits for the job's
-- row.
SELECT queue, has_observations FROM jobs WHERE id = ? FOR UPDATE
