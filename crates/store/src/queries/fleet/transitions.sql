-- Every schema transition and whether its backfill is done.
SELECT name, release_version, completed_at IS NOT NULL AS completed, backfills
FROM schema_transitions
ORDER BY name
