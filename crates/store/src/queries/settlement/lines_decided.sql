-- The lines {ids} were matched with what was read at ? (their key's
-- decision applied): not matched again, unless one changed meanwhile.
UPDATE settlement_lines
SET decided_at = UTC_TIMESTAMP(6)
WHERE id IN ({ids}) AND decided_at IS NULL AND updated_at <= {read_at}
