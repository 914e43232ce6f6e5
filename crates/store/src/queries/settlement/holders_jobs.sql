-- The jobs of the provider's queues that hold operation keys of the batch.
-- Parameters: a JSON array of the provider's queues, and a JSON array of
-- the keys (see `json_list` in crates/store/src/settlement/mod.rs), each
-- read as a table; every (queue, key) pair is one lookup in the jobs'
-- unique (queue, operation_key) index. Both columns are joined by
-- equality: with the queues as `IN (…)` and more than one queue, MariaDB
-- scanned (and with {lock}, locked) every job of the provider's queues.
-- The keys travel once, as a bound string, where a list of literals cost
-- the server about twice as much to parse (docs/benchmarks.md,
-- "Settlement import"); STRAIGHT_JOIN keeps the two small tables first.
-- A key is unique per queue; the provider's queues are distinct
-- queues, so a key names at most one job among them unless two of its
-- queues used it (every such job is read, with the provider reference it
-- recorded: the decision takes the one that recorded the refund's, see
-- crates/domain/src/settlement/held.rs). {lock} is FOR
-- UPDATE when an import reads them in the
-- transaction that writes its lines: every import writing a line of one
-- of these keys then waits here for the others, so a line decided with its
-- insert is decided knowing every other line of its key (READ COMMITTED
-- takes no gap locks, and a key's first line has no row to lock). A live
-- job is locked too, for as long as the batch's short transaction: a
-- Claim skips it (SKIP LOCKED), a Complete waits for it.
SELECT STRAIGHT_JOIN j.id AS job_id, CAST(j.queue AS CHAR) AS queue,
       CAST(j.operation_key AS CHAR) AS operation_key, CAST(j.state AS CHAR) AS state,
       j.attempt, j.payload, CAST(j.provider_reference AS CHAR) AS provider_reference
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         q VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS qs
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
         k VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
JOIN jobs j FORCE INDEX (uq_jobs_queue_operation_key)
  ON j.queue = qs.q AND j.operation_key = t.k
{lock}
