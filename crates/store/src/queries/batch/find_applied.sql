-- Which of these fenced calls (job, attempt, request digest) were already
-- applied? Rejections carry no digest, so only applied calls match: a match
-- is an exact replay of a call whose answer was lost.
SELECT t.job_id, e.kind, e.detail
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         job_id  BIGINT UNSIGNED PATH '$.job_id',
         attempt BIGINT UNSIGNED PATH '$.attempt',
         digest  CHAR(64) CHARACTER SET ascii COLLATE ascii_bin PATH '$.digest')) AS t
STRAIGHT_JOIN job_events e FORCE INDEX (ix_job_events_job_attempt)
  ON e.job_id = t.job_id AND e.attempt = t.attempt AND e.request_digest = UNHEX(t.digest)
ORDER BY e.id
