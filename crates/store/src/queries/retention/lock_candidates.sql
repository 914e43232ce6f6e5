-- Pruning: locks the batch's candidates that are still terminal, skipping
-- rows another pruner holds (never waiting for them). Terminal states
-- never change, but the state is checked here and again in the DELETE: a
-- live job is never pruned. {ids} is the comma-separated candidate list.
SELECT id FROM jobs WHERE id IN ({ids})
  AND state IN ('succeeded', 'failed', 'cancelled') AND finished_at IS NOT NULL
ORDER BY id FOR UPDATE SKIP LOCKED
