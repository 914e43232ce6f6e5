-- New lines. Parameters: the provider, and a JSON array with one object
-- per line (see `line_rows` in crates/store/src/settlement/lines.rs):
-- "r" provider_reference, "k" operation_key (absent: NULL), "a"
-- amount_minor, "c" currency, "s" status, "t" refund_created_at
-- (`YYYY-MM-DD HH:MM:SS.ffffff`, UTC), "d" 1 when the line is inserted
-- decided, 0 when it is left undecided (decided_at NULL). The lines travel
-- as one bound string, read as a table: a VALUES list of literals cost the
-- server more to parse than the rows cost to insert (docs/benchmarks.md,
-- "Settlement import"). A line another import inserted after this one's
-- locking read is a duplicate key: the batch runs again and updates it.
INSERT INTO settlement_lines (
    provider, provider_reference, operation_key, amount_minor, currency, status,
    refund_created_at, first_seen_at, updated_at, decided_at
)
SELECT ?, t.r, t.k, t.a, t.c, t.s, t.t, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
       CASE WHEN t.d = 1 THEN UTC_TIMESTAMP(6) END
FROM JSON_TABLE(?, '$[*]' COLUMNS (
         r VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.r',
         k VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.k',
         a BIGINT PATH '$.a',
         c CHAR(3) CHARACTER SET ascii COLLATE ascii_bin PATH '$.c',
         s VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin PATH '$.s',
         t DATETIME(6) PATH '$.t',
         d INT PATH '$.d')) AS t
