-- Lines by their ids {ids} (the keyless ones of a batch), with the moment
-- they were read.
SELECT id, provider_reference, operation_key, amount_minor, currency, status,
       refund_created_at, UTC_TIMESTAMP(6) AS read_at
FROM settlement_lines
WHERE id IN ({ids})
