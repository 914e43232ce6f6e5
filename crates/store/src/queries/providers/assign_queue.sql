-- PutProvider gives one queue to the provider. A queue already given to
-- another provider keeps it (the row is left as it is) and the call is
-- refused once the rows are read back under the locks this statement
-- took (queue_policies/lock_queues.sql), so two operators giving one queue
-- to two providers at once cannot both succeed.
-- Binds: queue, provider, operator.
INSERT INTO queue_policies (queue, provider, updated_at, updated_by)
VALUES (?, ?, UTC_TIMESTAMP(6), ?)
ON DUPLICATE KEY UPDATE
    updated_by = IF(provider IS NULL OR provider = VALUES(provider), VALUES(updated_by), updated_by),
    updated_at = IF(provider IS NULL OR provider = VALUES(provider), VALUES(updated_at), updated_at),
    provider = IF(provider IS NULL, VALUES(provider), provider)
