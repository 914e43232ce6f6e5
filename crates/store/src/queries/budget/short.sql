-- That a queue sharing its provider wanted jobs the budget held back (the
-- fair share). Sent as text: {now} and {queue} are literals.
UPDATE queue_policies SET last_short_at = {now} WHERE queue = {queue}
