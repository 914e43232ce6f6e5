-- The claim's rules for a queue known to have no provider: its own row
-- of queue_policies only (its stored resend policy, its provider, an
-- operator's pause), a plain primary-key read. When the row names a
-- provider after all, the claim's scans found nothing (see the guard in
-- the scans) and the claim reads the full rules (rules.sql), the
-- provider's row locked before any job row. Sent as text: {queue} is
-- written in as a literal (see store::literal).
SELECT queue, provider, resend_window_us, max_dispatches, last_granted_at, last_short_at,
       paused_at
FROM queue_policies
WHERE queue = {queue}
