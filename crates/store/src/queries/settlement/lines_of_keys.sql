-- Every line of the provider for the keys {keys}, whatever their status,
-- with the moment they were read (a line changed after it is matched
-- again).
SELECT id, provider_reference, operation_key, amount_minor, currency, status,
       refund_created_at, UTC_TIMESTAMP(6) AS read_at
FROM settlement_lines
WHERE provider = {provider} AND operation_key IN ({keys})
