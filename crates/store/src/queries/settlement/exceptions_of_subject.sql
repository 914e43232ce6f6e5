-- The exceptions of one subject not resolved, locked: those a new decision
-- no longer raises are resolved by the report.
SELECT id, kind, state FROM settlement_exceptions
WHERE provider = ? AND subject = ? AND state <> 'resolved'
FOR UPDATE
