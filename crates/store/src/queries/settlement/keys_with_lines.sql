-- Which of the keys {keys} already have a line of the provider, read
-- with a shared lock: a line of one of them inserted by another import at
-- the same moment waits for this transaction, or this one for it (a
-- deadlock, run again), so two imports never both take a key's first
-- line for its only one.
SELECT DISTINCT CAST(operation_key AS CHAR) AS operation_key
FROM settlement_lines
WHERE provider = {provider} AND operation_key IN ({keys})
LOCK IN SHARE MODE
