-- A line seen again with something changed (its status, usually: pending,
-- then succeeded or failed): rewritten, and its key matched again.
UPDATE settlement_lines
SET operation_key = ?, amount_minor = ?, currency = ?, status = ?, refund_created_at = ?,
    updated_at = UTC_TIMESTAMP(6), decided_at = NULL
WHERE id = ?
