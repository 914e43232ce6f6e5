-- A queue's frontier (docs/design.md rule 18): the highest round of its
-- jobs handed out, running or finished but cancelled; each one seek from
-- the end of its state's range of ix_jobs_fair. Enqueue computes the same
-- in its CTE (queries/enqueue/insert.sql).
SELECT GREATEST(
    COALESCE((SELECT fair_round FROM jobs FORCE INDEX (ix_jobs_fair)
              WHERE queue = ? AND state = 'running' ORDER BY fair_round DESC LIMIT 1), 0),
    COALESCE((SELECT fair_round FROM jobs FORCE INDEX (ix_jobs_fair)
              WHERE queue = ? AND state = 'succeeded' ORDER BY fair_round DESC LIMIT 1), 0),
    COALESCE((SELECT fair_round FROM jobs FORCE INDEX (ix_jobs_fair)
              WHERE queue = ? AND state = 'failed' ORDER BY fair_round DESC LIMIT 1), 0),
    COALESCE((SELECT fair_round FROM jobs FORCE INDEX (ix_jobs_fair)
              WHERE queue = ? AND state = 'manual_review' ORDER BY fair_round DESC LIMIT 1), 0)
) AS frontier
