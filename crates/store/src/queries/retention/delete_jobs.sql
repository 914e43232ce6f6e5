-- Pruning: the batch's locked jobs, their state checked once more. {ids}:
-- the comma-separated list of locked jobs.
DELETE FROM jobs WHERE id IN ({ids}) AND state IN ('succeeded', 'failed', 'cancelled')
