-- RenewLease, fenced on id + state + attempt. Never shortens the lease, and
-- leaves updated_at alone: a renewal inside the current lease matches the
-- row but changes nothing (sqlx reports matched rows, so it still counts as
-- applied).
UPDATE jobs
SET lease_until = GREATEST(lease_until, DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND))
WHERE id = ? AND state = 'running' AND attempt = ?
