-- A covered period: the same period imported again is one row.
INSERT INTO settlement_periods (
    provider, period_start, period_end, first_imported_at, last_imported_at, last_imported_by
) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?)
ON DUPLICATE KEY UPDATE last_imported_at = UTC_TIMESTAMP(6), last_imported_by = VALUES(last_imported_by)
