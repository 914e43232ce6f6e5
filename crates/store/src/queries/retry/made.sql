-- Whether the new operation of a retry exists: a job of the queue with
-- the reserved key, or its key record once pruned (docs/design.md rule
-- 14). A reservation is committed before its job is enqueued, so a call
-- cut off between the two leaves a reservation with no job. Binds: the
-- queue and the reserved key, twice.
SELECT EXISTS (SELECT 1 FROM jobs WHERE queue = ? AND operation_key = ?)
    OR EXISTS (SELECT 1 FROM operation_keys WHERE queue = ? AND operation_key = ?)
    AS made
