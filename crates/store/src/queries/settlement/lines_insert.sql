-- New lines, undecided (decided_at NULL). {rows}: one tuple per line,
-- (provider, provider_reference, operation_key, amount_minor, currency,
-- status, refund_created_at, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL),
-- values as literals. A line another import inserted after this one's
-- locking read is left as that import wrote it.
INSERT INTO settlement_lines (
    provider, provider_reference, operation_key, amount_minor, currency, status,
    refund_created_at, first_seen_at, updated_at, decided_at
) VALUES {rows}
ON DUPLICATE KEY UPDATE settlement_lines.id = settlement_lines.id
