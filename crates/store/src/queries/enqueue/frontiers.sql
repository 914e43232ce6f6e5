-- The frontier of each queue of an Enqueue batch (docs/design.md rule 18):
-- the highest round of its jobs handed out (running, or finished but
-- cancelled), each one seek from the end of its state's range of
-- ix_jobs_fair; a JSON object by queue in @jf_frontiers, read by the
-- INSERT that follows (insert.sql), which may not select from the table
-- it inserts into on MySQL. queries/fairness/frontier.sql is the same for
-- one queue.
SET @jf_frontiers = (
    SELECT JSON_OBJECTAGG(q.queue, GREATEST(
        COALESCE((SELECT j.fair_round FROM jobs j FORCE INDEX (ix_jobs_fair)
                  WHERE j.queue = q.queue AND j.state = 'running' ORDER BY j.fair_round DESC LIMIT 1), 0),
        COALESCE((SELECT j.fair_round FROM jobs j FORCE INDEX (ix_jobs_fair)
                  WHERE j.queue = q.queue AND j.state = 'succeeded' ORDER BY j.fair_round DESC LIMIT 1), 0),
        COALESCE((SELECT j.fair_round FROM jobs j FORCE INDEX (ix_jobs_fair)
                  WHERE j.queue = q.queue AND j.state = 'failed' ORDER BY j.fair_round DESC LIMIT 1), 0),
        COALESCE((SELECT j.fair_round FROM jobs j FORCE INDEX (ix_jobs_fair)
                  WHERE j.queue = q.queue AND j.state = 'manual_review' ORDER BY j.fair_round DESC LIMIT 1), 0)))
    FROM (SELECT DISTINCT queue FROM JSON_TABLE(?, '$[*]' COLUMNS (
             queue VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin PATH '$.queue')) AS t) AS q
)
