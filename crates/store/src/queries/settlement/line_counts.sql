-- The provider's lines by status.
SELECT CAST(status AS CHAR) AS status, COUNT(*) AS n
FROM settlement_lines WHERE provider = ? GROUP BY status
