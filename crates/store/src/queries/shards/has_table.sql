-- Whether the migrations made this database's jobfence_shard table.
SELECT COUNT(*) FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'jobfence_shard'
