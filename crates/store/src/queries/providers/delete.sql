-- DeleteProvider, once its queues were released.
DELETE FROM providers WHERE name = ?
