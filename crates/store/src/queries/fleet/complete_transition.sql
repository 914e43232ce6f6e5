-- A transition's backfill is done. Binds: who ran it, rows changed, name.
UPDATE schema_transitions
SET completed_at = UTC_TIMESTAMP(6),
    completed_by = ?,
    rows_changed = ?,
    backfills = backfills + 1
WHERE name = ?
