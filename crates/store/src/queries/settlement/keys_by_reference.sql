-- The operation keys of jobs (or key records) of the provider's queues
-- whose recorded provider reference is one of {refs}: how a line that
-- names no operation key is matched. {queues}: the provider's queues.
SELECT CAST(provider_reference AS CHAR) AS provider_reference, CAST(operation_key AS CHAR) AS operation_key
FROM jobs WHERE queue IN ({queues}) AND provider_reference IN ({refs})
UNION ALL
SELECT CAST(provider_reference AS CHAR), CAST(operation_key AS CHAR)
FROM operation_keys WHERE queue IN ({queues}) AND provider_reference IN ({refs})
