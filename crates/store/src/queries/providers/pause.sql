-- PauseProvider: every hand-out, or only the sends, held until an operator
-- resumes. Binds: pause, reason, operator, name.
UPDATE providers SET pause = ?, pause_reason = ?,
    updated_at = UTC_TIMESTAMP(6), updated_by = ?
WHERE name = ?
