-- The finished jobs {ids} that hold keys of a batch's lines, locked for
-- the batch's transaction: every import writing a line of one of these
-- keys waits here for the others, so a line decided with its insert is
-- decided knowing every other line of its key (READ COMMITTED takes no
-- gap locks, and a key's first line has no row to lock). Live jobs are
-- not locked: their lines are decided after the insert commits, by a
-- read that sees every committed line.
SELECT id FROM jobs
WHERE id IN ({ids}) AND state IN ('succeeded', 'failed', 'cancelled')
ORDER BY id
FOR UPDATE
