-- Exceptions not resolved, by provider and kind.
SELECT CAST(provider AS CHAR) AS provider, CAST(kind AS CHAR) AS kind, COUNT(*) AS n
FROM settlement_exceptions WHERE state <> 'resolved' GROUP BY provider, kind
