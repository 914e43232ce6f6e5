-- The queue of one job, by primary key: labels a refused write that did
-- not say which queue it was about.
SELECT queue FROM jobs WHERE id = ?
