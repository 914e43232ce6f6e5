-- ResolveManualReview, and a BulkRepair's resolutions: each job fenced on
-- its own id + state + attempt (the fence list holds `(id, attempt)` of
-- each) like every worker write: it applies only while the job is still
-- parked under the attempt the operator saw, so of two operators resolving
-- the same job one is refused. The caller holds every row's lock and
-- checked each under it; a count short of the list rolls the transaction
-- back.
-- Parameters: new state; next_action (NULL keeps it); is_retry and the delay
-- in microseconds (run_at); provider_reference and result (NULL keeps them);
-- state_reason; whether to restart the resend window (an authorized
-- resend); whether the new state is terminal (finished_at); then {ids},
-- then {fences}. One resolution for every row of the list.
-- Each assignment reads only its own column, so MySQL's left-to-right and
-- MariaDB's simultaneous assignment give the same row. The plain id list
-- and FORCE INDEX keep it to one primary-key lookup per row.
UPDATE jobs FORCE INDEX (PRIMARY)
SET state = ?,
    next_action = COALESCE(?, next_action),
    run_at = IF(?, DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), run_at),
    provider_reference = COALESCE(?, provider_reference),
    result = COALESCE(?, result),
    state_reason = ?,
    first_dispatched_at = IF(?, NULL, first_dispatched_at),
    lease_until = NULL,
    updated_at = UTC_TIMESTAMP(6),
    finished_at = IF(?, UTC_TIMESTAMP(6), NULL)
WHERE id IN ({ids}) AND state = 'manual_review' AND (id, attempt) IN ({fences})
