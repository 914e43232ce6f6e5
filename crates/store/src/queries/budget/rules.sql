-- The stored rules of one queue, read first in its claim or takeover
-- transaction (docs/design.md rules 11-13), in the claim's first round trip.
-- A claim prepares them once per session, {queue} a parameter, and sends
-- them with EXECUTE (store/claim/scan.rs); a takeover sends them as text,
-- {queue} written in as a literal (see store::literal).
--
-- 1. The provider the queue dispatches to, its row locked until COMMIT:
--    claims of one provider queue here, on every coordinator, so each one
--    sees the units the previous one spent. The look-up of the name is a
--    plain read (no lock on queue_policies); 2. tells if it moved since.
SELECT name, rate_per_second, burst, max_in_flight, execute_cost, reconcile_cost,
       tat, pause, throttled_until, UTC_TIMESTAMP(6) AS now
FROM providers
WHERE name = (SELECT provider FROM queue_policies WHERE queue = {queue})
FOR UPDATE;
-- 2. The queue's own row (its stored resend policy, its provider, an
--    operator's pause of the queue) and the rows of the other queues of its
--    provider (to share the units). any_expired, in every row, is whether a
--    lease of the claim's queue ran out (as in queue_row.sql, which says
--    why it is read this way; uncorrelated, so evaluated once): a claim
--    that reads these statements prepared sends its expired-lease scan
--    only then (store/claim/scan.rs).
SELECT queue, provider, resend_window_us, max_dispatches, last_granted_at, last_short_at,
       paused_at,
       COALESCE((SELECT MIN(j.lease_until) FROM jobs j FORCE INDEX (ix_jobs_claim_expired)
                 WHERE j.queue = {queue} AND j.state = 'running') <= UTC_TIMESTAMP(6), 0)
         AS any_expired
FROM queue_policies
WHERE queue = {queue}
   OR provider = (SELECT provider FROM queue_policies WHERE queue = {queue});
-- 3. The provider's jobs in flight (running with a live lease), counted
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
