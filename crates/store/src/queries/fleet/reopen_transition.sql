-- An older coordinator is seen (or may have run while no newer one
-- watched): the transition is open again, and its quiet period starts
-- now; newer coordinators keep the older behaviour until its backfill has
-- run again. Bind: name.
UPDATE schema_transitions
SET opened_at = UTC_TIMESTAMP(6),
    completed_at = NULL,
    completed_by = NULL
WHERE name = ?
