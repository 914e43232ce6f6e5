-- Records this database's shard number the first time; IGNORE: another
-- coordinator that recorded one meanwhile wins (0 rows), and the number is
-- read again. Binds: the shard number.
INSERT IGNORE INTO jobfence_shard (singleton, shard, created_at)
VALUES (1, ?, UTC_TIMESTAMP(6))
