-- Jobs in flight (running with a live lease, DB clock) per provider, over
-- all its queues: one range of the claim index per queue.
SELECT qp.provider, COUNT(*) AS in_flight
FROM queue_policies qp
JOIN jobs j FORCE INDEX (ix_jobs_claim_expired)
  ON j.queue = qp.queue AND j.state = 'running' AND j.lease_until > UTC_TIMESTAMP(6)
WHERE qp.provider IS NOT NULL
GROUP BY qp.provider
