-- Unguarded, like scan_expired.sql: a claim that read only the queue's own
-- row (queries/budget/queue_row.sql) and finds a provider named there after
-- all scans again with the full rules, the provider's row locked after the
-- rows this scan locked (as a Takeover's is; see store/budget.rs, lock
-- order), and hands out only what the budget allows of them.
-- Claim scan 2: due ready jobs of a queue in the fair order
-- (docs/design.md rule 18): lowest start round first, then oldest run_at
-- (jobs of one round, and every job written before rounds, at round 0).
-- Locks what it returns; rows another claim holds are skipped.
-- FORCE INDEX: read in (fair_round, run_at) order and stop at LIMIT. A
-- table scan plus filesort (which the optimizer may pick on a small or
-- fresh table) would lock every due row it sorted, and concurrent claims
-- would find nothing. Jobs not yet due are passed over on the index
-- (run_at is in it), without reading their rows.
-- Sent in one round trip with the queue's rules, prepared once per session
-- with the queue and the limit as parameters (store/claim/scan.rs), so a
-- lone worker's claims are not parsed each time; {only} is empty then. The
-- second scan of a claim whose provider's sends are paused sends it as
-- text, the queue and the limit written in as literals (see store::literal),
-- {only} limiting it to reconciles.
-- Finished jobs are under other `state` values of the index, so however
-- many pile up, this range never reads them.
SELECT {locked_job_columns}
FROM jobs FORCE INDEX (ix_jobs_fair)
WHERE queue = {queue} AND state = 'ready' AND fair_round > -4611686018427387904
  AND run_at <= UTC_TIMESTAMP(6) {only}
ORDER BY fair_round, run_at
LIMIT {limit}
FOR UPDATE SKIP LOCKED
