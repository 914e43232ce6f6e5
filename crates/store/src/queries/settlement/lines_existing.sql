-- The lines of this batch already held, locked: an import decides what is
-- new or changed under these locks, so two imports of one file at once
-- write each line once. Parameters: the provider, and a JSON array of the
-- batch's provider references, read as a table (see holders_jobs.sql).
SELECT STRAIGHT_JOIN l.id, l.provider_reference, l.operation_key, l.amount_minor, l.currency,
       l.status, l.refund_created_at
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         r VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t
JOIN settlement_lines l ON l.provider = ? AND l.provider_reference = t.r
FOR UPDATE
