SELECT period_start, period_end, last_imported_at, last_imported_by
FROM settlement_periods WHERE provider = ? ORDER BY period_start, period_end
