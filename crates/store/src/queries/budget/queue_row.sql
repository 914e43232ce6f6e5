-- The claim's rules for a queue known to have no provider (and, after
-- rules.sql, for one missing from the locked provider's queues, in the
-- claim's second round trip or with a takeover's rules as text): its own row
-- of queue_policies only (its stored resend policy, its provider, an
-- operator's pause), a plain primary-key read; always one row, all NULL
-- when the queue has no row: an aggregate with no GROUP BY answers one row
-- even over no rows, and MAX over the one row a primary key gives is that
-- row's value. (A LEFT JOIN from a one-row derived table said the same and
-- cost the database about 25 µs more per execution, prepared or not: the
-- derived table is set up at every run.) When the row names a provider after all, the
-- claim reads the full rules (rules.sql) and scans again in the same
-- transaction: the provider's row is then locked after the job rows the
-- first ready scan locked (see store/claim/scan.rs). Prepared once per
-- session of the batch pool and run with EXECUTE in the claim's first round
-- trip (store/claim/scan.rs): {queue} is a parameter, given twice.
-- any_expired: whether a running job of the queue has a lease that ran out
-- by the database clock: the earliest lease of the queue's running jobs,
-- which the optimizer reads with one look at the start of the expired-lease
-- index while it plans the statement (an EXISTS over that range cost the
-- database about a quarter more for this statement). It locks nothing. Only then does
-- the claim send its expired-lease scan: a claim where no lease has run
-- out, the usual one, costs one statement less. The job a handoff is
-- writing itself counts too: if its own lease ran out, the scan is sent
-- and finds nothing (it leaves that job out), a round trip for nothing but
-- never a takeover missed. No running job: NULL, read as false.
SELECT MAX(qp.queue) AS queue, MAX(qp.provider) AS provider,
       MAX(qp.resend_window_us) AS resend_window_us, MAX(qp.max_dispatches) AS max_dispatches,
       MAX(qp.last_granted_at) AS last_granted_at, MAX(qp.last_short_at) AS last_short_at,
       MAX(qp.paused_at) AS paused_at,
       COALESCE((SELECT MIN(j.lease_until) FROM jobs j FORCE INDEX (ix_jobs_claim_expired)
                 WHERE j.queue = {queue} AND j.state = 'running') <= UTC_TIMESTAMP(6), 0)
         AS any_expired
FROM queue_policies qp
WHERE qp.queue = {queue}
