-- Key records past their own retention (a plain read; deleted by job id
-- next): never before their queue's job retention has also ended, so a key
-- record always outlives its job (docs/design.md rule 14).
-- Binds: key retention (us), default job retention (us), batch size.
SELECT k.job_id
FROM operation_keys k FORCE INDEX (ix_operation_keys_finished)
LEFT JOIN queue_policies p ON p.queue = k.queue
WHERE k.finished_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)
  AND k.finished_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL COALESCE(p.job_retention_us, ?) MICROSECOND)
LIMIT ?
