-- Claim scan 3 (docs/design.md rule 18): due ready jobs of a queue not yet
-- placed in the fair order (enqueued or retried with a delay: UNPLACED,
-- fair_round -2^62), oldest first, locked with SKIP LOCKED like scan 2.
-- The claim places them at the back of their lines (store/fairness.rs)
-- and may hand them out at once. One range of ix_jobs_fair: only such
-- jobs already due are read. Prepared with scan 2, the same parameters.
SELECT {locked_job_columns}
FROM jobs FORCE INDEX (ix_jobs_fair)
WHERE queue = {queue} AND state = 'ready' AND fair_round = -4611686018427387904
  AND run_at <= UTC_TIMESTAMP(6)
ORDER BY run_at
LIMIT {limit}
FOR UPDATE SKIP LOCKED
