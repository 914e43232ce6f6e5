-- Claim or takeover of one locked row: the attempt (fencing token) goes up
-- by one. Still fenced on the state and attempt read under the lock, so a
-- row that changed since cannot be claimed twice.
-- Each assignment reads only its own column, so the result is the same
-- whether the server assigns left to right (MySQL) or simultaneously
-- (MariaDB's SIMULTANEOUS_ASSIGNMENT mode).
UPDATE jobs
SET attempt = attempt + 1,
    state = 'running',
    next_action = ?,
    lease_until = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND),
    lease_owner = ?,
    dispatch_count = dispatch_count + ?,
    first_dispatched_at = IF(? AND first_dispatched_at IS NULL, UTC_TIMESTAMP(6), first_dispatched_at),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ? AND state = ? AND attempt = ?
