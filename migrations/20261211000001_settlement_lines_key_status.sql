-- The key index of settlement_lines gains the line's status, so that the
-- search for succeeded jobs with no settled refund (MISSING_AT_PROVIDER,
-- crates/store/src/queries/settlement/missing_jobs.sql and
-- missing_keys.sql) answers "does this key have a succeeded line?" from
-- the index alone: before, each job probed the index, then read the line's
-- row for its status. At the end of an import of a million lines, alone
-- on the machine, that search took about 3.5 s with the old index and 2.8 s
-- with this one; run by hand on a cold buffer pool, 5.4 s and 2.4 s
-- (docs/benchmarks.md, "Settlement import"). Every statement that read
-- the old index (provider, operation_key) reads this one's prefix. The
-- same statement runs on MySQL 8.4 and MariaDB 10.11 (an in-place
-- rebuild of the one index).
ALTER TABLE settlement_lines
    DROP INDEX ix_settlement_lines_key,
    ADD INDEX ix_settlement_lines_key (provider, operation_key, status);
