-- The providers of the queues a PutProvider names, read back under their
-- row locks. {queues} is a list of placeholders, one per queue.
SELECT queue, provider FROM queue_policies WHERE queue IN ({queues}) FOR UPDATE
