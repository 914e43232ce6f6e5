-- The jobs of the provider's queues ({queues}) that hold operation keys of
-- {keys}. A key is unique per queue; the provider's queues are distinct
-- queues, so a key names at most one job among them unless two of its
-- queues used it. {lock} is FOR UPDATE when an import reads them in the
-- transaction that writes its lines: every import writing a line of one
-- of these keys then waits here for the others, so a line decided with its
-- insert is decided knowing every other line of its key (READ COMMITTED
-- takes no gap locks, and a key's first line has no row to lock). A live
-- job is locked too, for as long as the batch's short transaction: a
-- Claim skips it (SKIP LOCKED), a Complete waits for it.
SELECT j.id AS job_id, CAST(j.queue AS CHAR) AS queue,
       CAST(j.operation_key AS CHAR) AS operation_key, CAST(j.state AS CHAR) AS state,
       j.attempt, j.payload
FROM jobs j
WHERE j.queue IN ({queues}) AND j.operation_key IN ({keys})
{lock}
