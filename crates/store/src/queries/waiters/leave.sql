-- Waiters that no longer wait for the provider's budget (handed a job, or
-- nothing due for them), and lapsed ones. Literals: {provider}, {waiters}
-- (a list of ids, never empty), {now}.
DELETE FROM budget_waiters
WHERE provider = {provider} AND (waiter IN ({waiters}) OR expires_at <= {now})
