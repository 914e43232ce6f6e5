-- An exception moved by a person (acknowledged, resolved) or by a report
-- (resolved): fenced on the state it was seen in.
UPDATE settlement_exceptions
SET state = ?, updated_at = UTC_TIMESTAMP(6)
WHERE id = ? AND state = ?
