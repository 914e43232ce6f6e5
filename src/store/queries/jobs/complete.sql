-- Complete, fenced on id + state + attempt. No `lease_until > now` here on
-- purpose: an expired lease only opens the job to takeover; the holder keeps
-- its write right until a takeover commits (DESIGN.md rule 1).
UPDATE jobs
SET state = 'succeeded',
    provider_reference = ?,
    result = ?,
    lease_until = NULL,
    state_reason = NULL,
    updated_at = UTC_TIMESTAMP(6),
    finished_at = UTC_TIMESTAMP(6)
WHERE id = ? AND state = 'running' AND attempt = ?
