-- The queues of one provider, by name.
SELECT queue FROM queue_policies WHERE provider = ? ORDER BY queue
