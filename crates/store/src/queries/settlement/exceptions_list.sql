-- Exceptions, newest first, in the states {states}; of a provider and of a
-- job when given (NULL: any).
SELECT id, provider, kind, subject, job_id, detail, state, opened_at, updated_at
FROM settlement_exceptions
WHERE state IN ({states})
  AND (? IS NULL OR provider = ?)
  AND (? IS NULL OR job_id = ?)
ORDER BY id DESC
LIMIT ?
