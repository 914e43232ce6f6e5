-- settlement_lines.job_id was never written (a line is matched through its
-- operation key, or its provider reference, at every import: see
-- crates/store/src/settlement/), so every line carried a NULL in it and an
-- entry in ix_settlement_lines_job that no query reads: one more index
-- insert per imported line, on the import's hot path (docs/benchmarks.md,
-- "Settlement import"). Both go; the same statement runs on MySQL 8.4 and
-- MariaDB 10.11.
ALTER TABLE settlement_lines
    DROP INDEX ix_settlement_lines_job,
    DROP COLUMN job_id;
