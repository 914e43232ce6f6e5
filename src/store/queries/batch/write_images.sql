-- Writes the new image of each job of a batch (claims, takeovers, and the
-- fenced writes Complete, Fail and RenewLease), as computed by
-- domain::transition from the row read under its lock. Fenced row by row
-- (DESIGN.md rule 3): a row is written only while it still has the `state`
-- and `attempt` its image was computed from, so a batch can never apply one
-- job's change to a row another attempt now holds. The caller holds every
-- row's lock and checks that each image matched; sqlx counts matched rows
-- (rule 10), so an image equal to the row (a renewal that extends nothing)
-- still counts.
-- Each assignment reads only the batch's values, never another column of
-- the row, so the result is the same whether the server assigns left to
-- right (MySQL) or simultaneously (MariaDB's SIMULTANEOUS_ASSIGNMENT).
-- STRAIGHT_JOIN and FORCE INDEX: one primary-key lookup per image, in the
-- (ascending) order of the batch, never a scan of the table (which would
-- wait on the rows other transactions hold).
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
         id                  BIGINT UNSIGNED PATH '$.id',
         fence_state         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin PATH '$.fence_state',
         fence_attempt       BIGINT UNSIGNED PATH '$.fence_attempt',
         state               VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin PATH '$.state',
         attempt             BIGINT UNSIGNED PATH '$.attempt',
         next_action         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin PATH '$.next_action',
         run_at              DATETIME(6) PATH '$.run_at',
         lease_until         DATETIME(6) PATH '$.lease_until',
         lease_owner         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.lease_owner',
         first_dispatched_at DATETIME(6) PATH '$.first_dispatched_at',
         dispatch_count      INT UNSIGNED PATH '$.dispatch_count',
         provider_reference  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.provider_reference',
         result              MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.result',
         last_error          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.last_error',
         state_reason        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.state_reason',
         updated_at          DATETIME(6) PATH '$.updated_at',
         finished_at         DATETIME(6) PATH '$.finished_at')) AS t
STRAIGHT_JOIN jobs FORCE INDEX (PRIMARY) ON jobs.id = t.id
SET jobs.state = t.state,
    jobs.attempt = t.attempt,
    jobs.next_action = t.next_action,
    jobs.run_at = t.run_at,
    jobs.lease_until = t.lease_until,
    jobs.lease_owner = t.lease_owner,
    jobs.first_dispatched_at = t.first_dispatched_at,
    jobs.dispatch_count = t.dispatch_count,
    jobs.provider_reference = t.provider_reference,
    jobs.result = t.result,
    jobs.last_error = t.last_error,
    jobs.state_reason = t.state_reason,
    jobs.updated_at = t.updated_at,
    jobs.finished_at = t.finished_at
WHERE jobs.state = t.fence_state AND jobs.attempt = t.fence_attempt
