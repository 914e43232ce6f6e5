-- A session's own connection id (signed, as every integer this crate
-- reads), the server's name for itself (the node a connection id belongs
-- to), and its database. A read: it never waits on a lock.
SELECT CAST(CONNECTION_ID() AS SIGNED) AS id,
       CONCAT(@@hostname, ':', @@port) AS node,
       COALESCE(DATABASE(), '') AS db
