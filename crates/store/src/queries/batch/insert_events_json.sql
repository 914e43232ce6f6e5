-- Entries of the append-only event log, in the caller's transaction, for a
-- large batch: the rows as one JSON array read with JSON_TABLE, in order (a
-- table function is read front to back; no ORDER BY, which would stage the
-- rows in a temporary table).
INSERT INTO job_events (
    job_id, queue, attempt, kind, from_state, to_state, current_attempt,
    request_digest, detail, created_at
)
SELECT t.job_id, t.queue, t.attempt, t.kind, t.from_state, t.to_state, t.current_attempt,
       UNHEX(t.request_digest), t.detail, t.created_at
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         job_id          BIGINT UNSIGNED PATH '$.job_id',
         queue           VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue',
         attempt         BIGINT UNSIGNED PATH '$.attempt',
         kind            VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin PATH '$.kind',
         from_state      VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin PATH '$.from_state',
         to_state        VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin PATH '$.to_state',
         current_attempt BIGINT UNSIGNED PATH '$.current_attempt',
         request_digest  CHAR(64) CHARACTER SET ascii COLLATE ascii_bin PATH '$.request_digest',
         detail          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.detail',
         created_at      DATETIME(6) PATH '$.created_at')) AS t
