-- One transition, locked for its backfill: a second coordinator deciding
-- the same waits here, then finds it completed.
SELECT completed_at IS NOT NULL AS completed
FROM schema_transitions
WHERE name = ?
FOR UPDATE
