-- What the migrations a newer release applied say of older coordinators
-- (migrations/20261213000001_rolling_upgrades.sql): every row; a
-- coordinator looks up the versions it does not carry.
SELECT version, older_coordinators, note
FROM schema_migration_notes
