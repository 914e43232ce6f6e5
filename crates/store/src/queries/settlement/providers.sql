-- The providers of this database with settlement settings.
SELECT CAST(provider AS CHAR) FROM settlement_settings ORDER BY provider
