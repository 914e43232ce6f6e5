-- The live waiters of a provider, in turn order (docs/design.md rule 11,
-- "Waiters take turns"): read by a claim under the provider's row lock,
-- and only while `providers.waiters_until` is in the future. Text with
-- literals: {provider}, {limit}.
SELECT waiter, expires_at
FROM budget_waiters FORCE INDEX (ix_budget_waiters_turn)
WHERE provider = {provider} AND expires_at > UTC_TIMESTAMP(6)
ORDER BY since, waiter
LIMIT {limit}
