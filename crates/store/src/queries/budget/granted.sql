-- When a queue that shares its provider was last served (the fair share).
-- Sent as text: {now} and {queue} are literals.
UPDATE queue_policies SET last_granted_at = {now} WHERE queue = {queue}
