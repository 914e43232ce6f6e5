-- The claim's rules for a queue known to have no provider: its own row
-- of queue_policies only (its stored resend policy, its provider, an
-- operator's pause), a plain primary-key read; always one row, all NULL
-- when the queue has no row. When the row names a provider after all, the
-- claim's scans found nothing (see the guard in the scans) and the claim
-- reads the full rules (rules.sql), the provider's row locked before any
-- job row. Sent as text: {queue} is written in as a literal (see
-- store::literal).
-- any_expired: whether a running job of the queue has a lease that ran out
-- by the database clock, a look at the expired-lease index that locks
-- nothing ({exclude} as in scan_expired.sql). Only then does the claim
-- send its expired-lease scan: a claim where no lease has run out, the
-- usual one, costs one statement less.
SELECT qp.queue, qp.provider, qp.resend_window_us, qp.max_dispatches, qp.last_granted_at,
       qp.last_short_at, qp.paused_at,
       EXISTS (SELECT 1 FROM jobs j FORCE INDEX (ix_jobs_claim_expired)
               WHERE j.queue = {queue} AND j.state = 'running'
                 AND j.lease_until <= UTC_TIMESTAMP(6) {exclude}) AS any_expired
FROM (SELECT 1 AS one) AS one_row
LEFT JOIN queue_policies qp ON qp.queue = {queue}
