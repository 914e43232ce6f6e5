-- Whether this database has the table named by the bind (of the current
-- schema): `_sqlx_migrations` tells a database never migrated,
-- `schema_migration_notes` one migrated by a release before 0.2.0.
SELECT COUNT(*)
FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE()
  AND TABLE_NAME = ?
