-- Where one of the provider's queues keeps a job's amount and currency in
-- its payload (JSON pointers; NULL: amounts of that queue are not
-- compared). Only a queue of this provider is changed.
UPDATE queue_policies
SET amount_pointer = ?, currency_pointer = ?, updated_at = UTC_TIMESTAMP(6), updated_by = ?
WHERE queue = ? AND provider = ?
