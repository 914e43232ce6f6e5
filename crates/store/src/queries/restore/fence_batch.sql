-- Moves the locked unfinished jobs of one primary-key range to the next
-- restore epoch (docs/design.md rule 17): the attempt goes up by the
-- epoch's step; a ready job is handed out next as reconcile (it may have
-- been sent since the backup, rule 5); a running job's lease ends now, so
-- the job is open to takeover at once (its holder is refused by the new
-- attempt already). Binds: the step, now (three times: the DB clock read
-- in the transaction, which the events carry too), the range's first and
-- last ids.
UPDATE jobs
SET attempt = attempt + ?,
    next_action = CASE WHEN state = 'ready' THEN 'reconcile' ELSE next_action END,
    lease_until = CASE WHEN state = 'running' AND lease_until > ? THEN ? ELSE lease_until END,
    updated_at = ?
WHERE id >= ? AND id <= ? AND state IN ('ready', 'running', 'manual_review')
