-- The queues that left a provider's list (PutProvider) dispatch to no
-- provider any more. {queues} is a list of placeholders, one per queue
-- kept. Binds: operator, provider, then the queues kept.
UPDATE queue_policies SET provider = NULL, updated_at = UTC_TIMESTAMP(6), updated_by = ?
WHERE provider = ? AND queue NOT IN ({queues})
