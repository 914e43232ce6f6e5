-- Whether the database answers a trivial query.
SELECT 1
