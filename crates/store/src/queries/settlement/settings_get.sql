-- A provider's settlement settings, with its queues and where each keeps a
-- job's amount and currency in the payload. One row per queue (the
-- provider's columns repeated); no row: the provider has no settings.
SELECT s.provider, s.preset, s.provider_reference_column, s.operation_key_column,
       s.amount_column, s.amount_unit, s.currency_column, s.status_column,
       s.created_column, s.created_format, CAST(s.lag_us AS SIGNED) AS lag_us,
       q.queue, q.amount_pointer, q.currency_pointer
FROM settlement_settings s
LEFT JOIN queue_policies q ON q.provider = s.provider
WHERE s.provider = ?
ORDER BY q.queue
