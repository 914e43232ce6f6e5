-- A settled refund of the job's operation key in the reports of its
-- queue's provider (docs/design.md rule 15): the money moved for this
-- operation, so trying it again as a new one would refund twice. Binds:
-- the job's queue, its operation key. Through ix_settlement_lines_key.
SELECT CAST(l.provider AS CHAR) AS provider,
       CAST(l.provider_reference AS CHAR) AS provider_reference
FROM queue_policies qp
JOIN settlement_lines l ON l.provider = qp.provider
WHERE qp.queue = ? AND l.operation_key = ? AND l.status = 'succeeded'
LIMIT 1
