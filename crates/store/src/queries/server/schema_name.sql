-- The name of the session's schema, which names the pruner's archive files.
SELECT DATABASE()
