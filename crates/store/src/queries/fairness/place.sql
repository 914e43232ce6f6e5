-- The new rounds of a batch's jobs going back to ready (JSON `[{id,
-- round}]`), one primary-key lookup a row, and the last start round of
-- each of their lines (`[{queue, fairness_key, priority, last_round}]`,
-- in primary-key order), in one round trip.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
         id         BIGINT UNSIGNED PATH '$.id',
         fair_round BIGINT PATH '$.round')) AS t
STRAIGHT_JOIN jobs FORCE INDEX (PRIMARY) ON jobs.id = t.id
SET jobs.fair_round = t.fair_round;
INSERT INTO fairness_keys (queue, fairness_key, priority, last_round)
SELECT t.queue, t.fairness_key, t.priority, t.last_round
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         n            FOR ORDINALITY,
         queue        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         fairness_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.fairness_key',
         priority     TINYINT UNSIGNED PATH '$.priority',
         last_round   BIGINT PATH '$.last_round')) AS t
ORDER BY t.n
ON DUPLICATE KEY UPDATE last_round = GREATEST(fairness_keys.last_round, VALUES(last_round))
