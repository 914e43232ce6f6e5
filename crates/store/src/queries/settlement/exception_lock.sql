-- One exception, locked, by its provider, kind and subject.
SELECT id, state, detail FROM settlement_exceptions
WHERE provider = ? AND kind = ? AND subject = ?
FOR UPDATE
