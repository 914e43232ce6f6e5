-- An exception raised again: its detail refreshed, and opened again if a
-- person or a report had resolved it.
UPDATE settlement_exceptions
SET detail = ?, job_id = ?, state = ?, updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
