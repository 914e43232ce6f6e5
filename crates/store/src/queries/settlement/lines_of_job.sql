-- The settlement lines of one job: its provider's (through its queue)
-- lines of its operation key, oldest first.
SELECT l.provider, l.id, l.provider_reference, l.operation_key, l.amount_minor, l.currency,
       l.status, l.refund_created_at
FROM settlement_lines l
JOIN queue_policies q ON q.provider = l.provider
WHERE q.queue = ? AND l.operation_key = ?
ORDER BY l.id
