-- The last start rounds of the (queue, fairness key, priority) lines of a
-- batch's jobs going back to ready, locked in primary-key order (after the
-- jobs' own rows: nobody who holds one of these waits for a job row).
SELECT k.queue, k.fairness_key, k.priority, k.last_round
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         queue        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         fairness_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.fairness_key',
         priority     TINYINT UNSIGNED PATH '$.priority')) AS t
STRAIGHT_JOIN fairness_keys k FORCE INDEX (PRIMARY)
  ON k.queue = t.queue AND k.fairness_key = t.fairness_key AND k.priority = t.priority
ORDER BY k.queue, k.fairness_key, k.priority
FOR UPDATE
