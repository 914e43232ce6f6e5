-- When each migration was applied (sqlx's `installed_on`, a TIMESTAMP, as
-- Unix seconds, whatever the session's time zone).
SELECT version, CAST(UNIX_TIMESTAMP(installed_on) AS SIGNED) AS applied_at
FROM _sqlx_migrations
ORDER BY version
