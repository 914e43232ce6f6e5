-- {exclude} is empty, or leaves out the jobs a Complete or Fail of the same
-- transaction is writing (docs/design.md rule 16): their new images are
-- written with the hand-outs'.
-- A claim sends this scan after its ready scan, and acts on the rules it
-- read.
-- Claim scan 1 (inline takeover): running jobs of a queue whose lease has
-- expired by the DB clock. Locks what it returns; rows another claim holds
-- are skipped, never waited for. FORCE INDEX for the reason given in
-- scan_ready.sql: lock only the rows taken, never the whole due set.
-- Sent as text, in a round trip after the claim's reads and ready scan, and
-- only when they said a lease of the queue ran out (queries/budget/
-- queue_row.sql, rules.sql): the queue and the limit are written in as
-- literals (see store::literal).
-- Returns the whole row (the claim's answer is built from it and the
-- change, without reading the job again) and the DB-clock facts the claim
-- decides on.
SELECT {locked_job_columns}
FROM jobs FORCE INDEX (ix_jobs_claim_expired)
WHERE queue = {queue} AND state = 'running' AND lease_until <= UTC_TIMESTAMP(6) {exclude}
ORDER BY lease_until
LIMIT {limit}
FOR UPDATE SKIP LOCKED
