-- The queues of every provider, by queue.
SELECT queue, provider FROM queue_policies WHERE provider IS NOT NULL ORDER BY queue
