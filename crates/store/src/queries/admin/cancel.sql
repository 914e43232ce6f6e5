-- CancelJob, and a BulkRepair's cancels: only ready jobs never dispatched
-- (no provider call can have happened), each fenced on its own id + state +
-- attempt (the fence list holds `(id, attempt)` of each; docs/design.md
-- rule 3). The caller holds every row's lock and checked each under it,
-- so each row matches; a count short of the list rolls the transaction
-- back. A claim that locked a row first wins (the caller's lock waited for
-- it, and its check refused the job); a claim that comes later skips the
-- locked rows, then finds them cancelled.
-- The plain id list and FORCE INDEX keep it to one primary-key lookup per
-- row, never a scan (see queries/batch/write_images.sql). Parameters: the
-- state_reason, then {ids}, then {fences}.
UPDATE jobs FORCE INDEX (PRIMARY)
SET state = 'cancelled',
    state_reason = ?,
    updated_at = UTC_TIMESTAMP(6),
    finished_at = UTC_TIMESTAMP(6)
WHERE id IN ({ids}) AND state = 'ready' AND dispatch_count = 0
  AND (id, attempt) IN ({fences})
