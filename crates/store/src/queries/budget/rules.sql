-- The stored rules of one queue, read first in its claim or takeover
-- transaction (docs/design.md rules 11-13), in the claim's first round trip.
-- A claim prepares them once per session, {queue} a parameter, and sends
-- them with EXECUTE (store/claim/scan.rs); a takeover sends them as text,
-- {queue} written in as a literal (see store::literal).
--
-- 1. The provider the queue dispatches to, its row locked until COMMIT,
--    and the rows of its queues (the claim's own queue: its stored resend
--    policy, an operator's pause; the others: to share the units), locked
--    after it until COMMIT too: claims of one provider queue here, on every
--    coordinator, so each one sees the units the previous one spent. One
--    statement where two were (the provider's row, then a plain read of the
--    queues' rows): on a lone worker's claim it cost the database about 60
--    µs less. STRAIGHT_JOIN keeps the lock order (the provider's row, then
--    its queues' rows, as an operator's change of a provider takes them);
--    the queues' rows, read under their locks, are their latest committed
--    versions. The look-up of the provider's name is a plain read (no
--    lock: a subquery's rows are not locked by the outer FOR UPDATE, on
--    either server); when the queue has no provider, or no longer this one,
--    its own row is missing from the result, and the claim reads that row
--    on its own (queue_row.sql; store/claim/scan.rs, store/budget.rs).
--    any_expired, in every row, is whether a lease of the claim's queue
--    ran out (as in queue_row.sql, which says why it is read this way;
--    uncorrelated, so evaluated once, and it locks nothing): a claim that
--    reads these statements prepared sends its expired-lease scan only
--    then (store/claim/scan.rs).
SELECT p.name, p.rate_per_second, p.burst, p.max_in_flight, p.execute_cost, p.reconcile_cost,
       p.key_share, p.max_in_flight_per_key,
       p.tat, p.pause, p.throttled_until, p.waiters_until, UTC_TIMESTAMP(6) AS now,
       qp.queue, qp.provider, qp.resend_window_us, qp.max_dispatches, qp.last_granted_at,
       qp.last_short_at, qp.paused_at,
       COALESCE((SELECT MIN(j.lease_until) FROM jobs j FORCE INDEX (ix_jobs_claim_expired)
                 WHERE j.queue = {queue} AND j.state = 'running') <= UTC_TIMESTAMP(6), 0)
         AS any_expired
FROM providers p
STRAIGHT_JOIN queue_policies qp FORCE INDEX (ix_queue_policies_provider) ON qp.provider = p.name
WHERE p.name = (SELECT provider FROM queue_policies WHERE queue = {queue})
FOR UPDATE;
-- 2. The provider's jobs in flight (running with a live lease), counted
--    only when it has a cap: one range of the claim index per queue. A
--    prepared claim sends it in its first round trip only when the queue's
--    provider had a cap at its last claim, else after the provider's row
--    (still locked) shows one. counted_at is the clock the leases were
--    compared with: a Complete or Fail that claims the next job leaves out
--    of the count the jobs it finishes itself that were counted (those it
--    holds locked, running, with a lease past counted_at; store/claim.rs).
SELECT COUNT(*) AS in_flight, UTC_TIMESTAMP(6) AS counted_at
FROM queue_policies qp
JOIN jobs j FORCE INDEX (ix_jobs_claim_expired)
  ON j.queue = qp.queue AND j.state = 'running' AND j.lease_until > UTC_TIMESTAMP(6)
WHERE qp.provider = (SELECT provider FROM queue_policies WHERE queue = {queue})
  AND (SELECT max_in_flight FROM providers p WHERE p.name = qp.provider) IS NOT NULL
