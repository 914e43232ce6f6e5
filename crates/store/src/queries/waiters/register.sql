-- A long-polling Claim held back by its provider's budget: written as a
-- waiter, or its registration refreshed, keeping its turn (`since`) while
-- the registration is live; a lapsed one starts again at the back. Sent
-- with the claim's COMMIT, under the provider's row lock. Literals:
-- {provider}, {waiter}, {queue}, {now}, {expires}.
INSERT INTO budget_waiters (provider, waiter, queue, since, expires_at)
VALUES ({provider}, {waiter}, {queue}, {now}, {expires})
ON DUPLICATE KEY UPDATE since = IF(expires_at > {now}, since, {now}), expires_at = {expires}
