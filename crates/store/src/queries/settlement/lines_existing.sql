-- The lines of this batch already held, locked: an import decides what is
-- new or changed under these locks, so two imports of one file at once
-- write each line once. {refs}: the batch's provider references, as
-- literals.
SELECT id, provider_reference, operation_key, amount_minor, currency, status, refund_created_at
FROM settlement_lines
WHERE provider = {provider} AND provider_reference IN ({refs})
FOR UPDATE
