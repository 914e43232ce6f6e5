-- A settlement report's line that names no operation key (a refund made by
-- hand in the provider's dashboard, a Stripe refund without the metadata
-- key) is matched by the provider reference a job recorded on Complete,
-- or a pruned job's key record kept (docs/design.md rule 15;
-- crates/store/src/queries/settlement/keys_by_reference.sql). No index
-- led to that column: each such batch read every job and every key record
-- of the provider's queues (20,021 handler reads for three references
-- among 5,000 jobs and 5,000 key records; with these indexes, a handful:
-- tests/in_process/settlement_matching.rs). Each index is (queue,
-- provider_reference), so one lookup per (queue, reference) of a batch.
--
-- What it costs: every job row carries an entry (NULL until a reference
-- is recorded), written by Enqueue and moved by the write that records a
-- reference (Complete, a resolution); every key record one, written by
-- the pruner (docs/benchmarks.md, "The provider reference's index").
-- Both are built online (in place, without blocking writes) on MySQL 8.4
-- and MariaDB 10.11; the same statements run on both.
CREATE INDEX ix_jobs_provider_reference ON jobs (queue, provider_reference);
CREATE INDEX ix_operation_keys_provider_reference ON operation_keys (queue, provider_reference);

INSERT INTO schema_migration_notes (version, older_coordinators, note)
VALUES (20261215000001, 'may_serve', 'adds two indexes; older coordinators write the columns as before and the database keeps the indexes');
