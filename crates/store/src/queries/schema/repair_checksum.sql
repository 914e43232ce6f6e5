-- A released migration that was edited in comments only, then restored:
-- the database recorded the edited file's checksum. Binds: the restored
-- file's checksum, the version, the edited file's checksum (so only that
-- known edit is repaired, never an unknown one).
UPDATE _sqlx_migrations
SET checksum = ?
WHERE version = ?
  AND checksum = ?
