-- Locks the jobs of a batch by primary key: the lock every fenced write and
-- named takeover decides under. Also PREPAREd with {ids} as one `?`, the
-- lock a lone handoff sends with its claim's reads (store/claim/scan.rs):
-- no other placeholder may be added here. The id list is a list of placeholders (padded to
-- a few sizes by repeating an id, so the server prepares few statements);
-- the primary-key range visits the ids in ascending order, so two batches
-- always take their locks in the same order and never deadlock each other.
-- FORCE INDEX: one primary-key lookup per id whatever the table's size (a
-- small table would otherwise be scanned, and the scan would wait on rows
-- other transactions hold).
-- Also read, by the database clock (docs/design.md rule 2): `now`, which stamps
-- every change of the batch; the time since the first dispatch (resend
-- window); whether the lease has expired (takeover); and whether the job
-- has observations (a column of the row: a takeover, which hands the job
-- out, reads them only when there are some).
SELECT {locked_job_columns}
FROM jobs FORCE INDEX (PRIMARY)
WHERE id IN ({ids})
FOR UPDATE
