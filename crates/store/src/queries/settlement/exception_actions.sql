SELECT action, operator, note, acted_at
FROM settlement_exception_actions WHERE exception_id = ? ORDER BY id
