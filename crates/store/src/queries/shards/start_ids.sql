-- Starts an empty table's ids in the shard's range. DDL, which commits by
-- itself: run after the transaction. {table} and {start} are written in
-- by shards.rs.
ALTER TABLE {table} AUTO_INCREMENT = {start}
