-- One step of an exception's life, with who and why.
INSERT INTO settlement_exception_actions (exception_id, action, operator, note, acted_at)
VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))
