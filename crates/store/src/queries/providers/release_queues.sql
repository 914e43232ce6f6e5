-- Every queue of a provider dispatches to no provider any more (a deleted
-- provider, or a PutProvider with no queues). Binds: operator, provider.
UPDATE queue_policies SET provider = NULL, updated_at = UTC_TIMESTAMP(6), updated_by = ?
WHERE provider = ?
