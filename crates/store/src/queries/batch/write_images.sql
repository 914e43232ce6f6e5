-- Writes the new image of each job of a batch (claims, takeovers, and the
-- fenced writes Complete, Fail and RenewLease), as computed by
-- domain::transition from the row read under its lock. Fenced row by row
-- (docs/design.md rule 3): a row is written only while it still has the `state`
-- and `attempt` its image was computed from (the fence list holds `(id,
-- state, attempt)` of each), so a batch can never apply one job's change to a row
-- another attempt now holds. The caller holds every row's lock and checks
-- that each image matched; sqlx counts matched rows (rule 10), so an image
-- equal to the row (a renewal that extends nothing) still counts.
-- Each CASE holds `WHEN id THEN new value` per row. Each assignment
-- reads only `id` and the batch's values, never a column it changes, so the
-- result is the same whether the server assigns left to right (MySQL) or
-- simultaneously (MariaDB's SIMULTANEOUS_ASSIGNMENT). A single-table UPDATE
-- changes each row where it finds it (a multi-table one would stage every
-- change in a temporary table first). The plain id list and FORCE INDEX keep
-- it to one primary-key lookup per row (the server does not turn a row
-- constructor list of placeholders into a range): never a scan, which would
-- read the whole table and wait on the rows other transactions hold.
UPDATE jobs FORCE INDEX (PRIMARY)
SET state               = CASE id {cases} END,
    attempt             = CASE id {cases} END,
    next_action         = CASE id {cases} END,
    run_at              = CASE id {cases} END,
    lease_until         = CASE id {cases} END,
    lease_owner         = CASE id {cases} END,
    first_dispatched_at = CASE id {cases} END,
    dispatch_count      = CASE id {cases} END,
    provider_reference  = CASE id {cases} END,
    result              = CASE id {cases} END,
    last_error          = CASE id {cases} END,
    state_reason        = CASE id {cases} END,
    updated_at          = CASE id {cases} END,
    finished_at         = CASE id {cases} END
WHERE id IN ({ids}) AND (id, state, attempt) IN ({fences})
