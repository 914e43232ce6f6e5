-- Per provider with settings: the newest covered period's end and the last
-- import, as Unix seconds (NULL: none).
SELECT CAST(s.provider AS CHAR) AS provider,
       CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', MAX(p.period_end)) AS SIGNED) AS newest_end_us,
       CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', MAX(p.last_imported_at)) AS SIGNED) AS last_import_us
FROM settlement_settings s
LEFT JOIN settlement_periods p ON p.provider = s.provider
GROUP BY s.provider
