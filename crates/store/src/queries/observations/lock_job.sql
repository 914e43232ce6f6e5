-- RecordObservation's first statement: the job's row in share mode (a
-- job's queue never changes; the scope check reads it). Taken before the
-- observation is inserted, so the pruner, which locks the job's row and
-- then deletes its observations, never waits for an observation whose
-- transaction waits for the job's row. LOCK IN SHARE MODE is understood by
-- MySQL 8.4 and MariaDB 10.11 alike (MariaDB has no FOR SHARE).
SELECT queue FROM jobs WHERE id = ? LOCK IN SHARE MODE
