-- Key records held (the retention gauges).
SELECT COUNT(*) FROM operation_keys
