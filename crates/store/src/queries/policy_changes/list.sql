-- Recorded changes, newest first: of one subject when given, with ids below
-- a cursor when given. Binds: subject twice, cursor twice, limit.
SELECT id, changed_at, operator, subject, action, reason, detail FROM policy_changes
WHERE (? IS NULL OR subject = ?) AND (? IS NULL OR id < ?)
ORDER BY id DESC LIMIT ?
