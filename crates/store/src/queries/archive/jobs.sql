-- The whole rows of a pruning batch's jobs, already locked by the batch (a
-- locking read, so it sees exactly what the DELETE will). {ids} is the
-- batch's comma-separated id list.
SELECT * FROM jobs WHERE id IN ({ids}) ORDER BY id FOR UPDATE
