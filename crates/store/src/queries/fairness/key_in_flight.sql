-- Caps per fairness key (docs/design.md rule 18): each candidate key's
-- jobs in flight (running with a live lease) over the provider's queues,
-- one range of the claim index per queue (as queries/budget/in_flight.sql).
-- {provider} and {keys} (a JSON array) are literals.
SELECT j.fairness_key, CAST(COUNT(*) AS SIGNED) AS in_flight
FROM queue_policies qp
JOIN jobs j FORCE INDEX (ix_jobs_claim_expired)
  ON j.queue = qp.queue AND j.state = 'running' AND j.lease_until > UTC_TIMESTAMP(6)
WHERE qp.provider = {provider}
  AND JSON_CONTAINS({keys}, JSON_QUOTE(j.fairness_key))
GROUP BY j.fairness_key
