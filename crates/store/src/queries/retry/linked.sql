-- Whether job ? already has its `retry_of` event (read under its row
-- lock: the link is written once however often the retry is asked).
SELECT COUNT(*) FROM job_events WHERE job_id = ? AND kind = 'retry_of'
