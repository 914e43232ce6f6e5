-- An older coordinator is seen again after a transition completed (a
-- rollback, or one restarted): newer ones keep the older behaviour, and
-- the backfill runs again once it is gone. Bind: name.
UPDATE schema_transitions
SET completed_at = NULL,
    completed_by = NULL
WHERE name = ?
  AND completed_at IS NOT NULL
