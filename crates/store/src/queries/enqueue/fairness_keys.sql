-- The last start round of each (queue, fairness key, priority) of a batch
-- just inserted (docs/design.md rule 18), found by the jobs' keys in the
-- same transaction: the next job of the key starts one round later.
-- Delayed jobs (UNPLACED) take no round until they come due. The
-- rows are locked in primary-key order (the GROUP BY's), so concurrent
-- batches never wait on each other in a cycle; a later round never moves
-- back.
INSERT INTO fairness_keys (queue, fairness_key, priority, last_round)
SELECT jobs.queue, jobs.fairness_key, jobs.priority,
       MAX(jobs.fair_round + (CAST(jobs.priority AS SIGNED) - 5) * 100)
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         want_queue VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         want_key   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.operation_key')) AS t
STRAIGHT_JOIN jobs FORCE INDEX (uq_jobs_queue_operation_key)
  ON jobs.queue = t.want_queue AND jobs.operation_key = t.want_key
WHERE jobs.fair_round <> -4611686018427387904
GROUP BY jobs.queue, jobs.fairness_key, jobs.priority
ORDER BY jobs.queue, jobs.fairness_key, jobs.priority
ON DUPLICATE KEY UPDATE last_round = GREATEST(last_round, VALUES(last_round))
