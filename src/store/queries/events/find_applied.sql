-- Was this exact fenced call (same job, attempt and request digest) already
-- applied? Rejections carry no digest, so only applied calls match.
SELECT kind, detail
FROM job_events
WHERE job_id = ? AND attempt = ? AND request_digest = ?
ORDER BY id
LIMIT 1
