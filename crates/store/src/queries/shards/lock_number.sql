-- The shard number recorded in this database, its row locked until COMMIT.
SELECT shard FROM jobfence_shard WHERE singleton = 1 FOR UPDATE
