-- When does the next job of a queue become claimable, in microseconds from
-- now by the DB clock (0 or less: already; NULL: nothing pending)? The
-- earliest run_at of its ready jobs and the earliest lease_until of its
-- running ones, each one dive into the claim scan's index. Read only when a
-- long-polling Claim found nothing, to sleep exactly until then.
SELECT CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), LEAST(
         COALESCE((SELECT MIN(run_at) FROM jobs FORCE INDEX (ix_jobs_claim_ready)
                   WHERE queue = ? AND state = 'ready'), '9999-12-31 00:00:00'),
         COALESCE((SELECT MIN(lease_until) FROM jobs FORCE INDEX (ix_jobs_claim_expired)
                   WHERE queue = ? AND state = 'running'), '9999-12-31 00:00:00')
       )) AS SIGNED) AS due_in_us
