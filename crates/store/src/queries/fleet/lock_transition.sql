-- One transition, locked for its backfill: a second coordinator deciding
-- the same waits here, then finds it completed. `quiet`: no coordinator
-- saw an older one for the quiet period (bind, microseconds): opened_at
-- is moved forward at every sighting, by every coordinator. Bind: the
-- quiet period, the name.
SELECT completed_at IS NOT NULL AS completed,
       opened_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AS quiet
FROM schema_transitions
WHERE name = ?
FOR UPDATE
