-- Exceptions not resolved, by provider, kind and state (open, acknowledged).
SELECT CAST(provider AS CHAR) AS provider, CAST(kind AS CHAR) AS kind,
       CAST(state AS CHAR) AS state, COUNT(*) AS n
FROM settlement_exceptions WHERE state <> 'resolved' GROUP BY provider, kind, state
