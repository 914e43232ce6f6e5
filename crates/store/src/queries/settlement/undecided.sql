-- Lines not matched since they last changed, oldest first: an import cut
-- off midway left them, and the next import of the provider matches them
-- before its own lines.
SELECT id, provider_reference, operation_key
FROM settlement_lines
WHERE provider = ? AND decided_at IS NULL
ORDER BY id
LIMIT ?
