-- The migrations sqlx applied to this database (its own table, made by
-- the first `jobfence migrate`), oldest first: version, description,
-- checksum (SHA-384 of the file), and whether it finished.
SELECT version, description, checksum, success
FROM _sqlx_migrations
ORDER BY version
