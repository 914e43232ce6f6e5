SELECT CAST(kind AS CHAR) AS kind, CAST(state AS CHAR) AS state, COUNT(*) AS n
FROM settlement_exceptions WHERE provider = ? GROUP BY kind, state
