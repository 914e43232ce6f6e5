-- Records one operator change of a provider or a queue's policy, in the
-- transaction of the change itself.
-- Binds: subject, action, operator, reason, detail (JSON).
INSERT INTO policy_changes (subject, action, operator, reason, detail, changed_at)
VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))
