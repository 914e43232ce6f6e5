-- Creates or replaces a provider's settlement settings (the provider must
-- exist: the foreign key refuses another name).
INSERT INTO settlement_settings (
    provider, preset, provider_reference_column, operation_key_column, amount_column,
    amount_unit, currency_column, status_column, created_column, created_format, lag_us,
    updated_at, updated_by
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), ?)
ON DUPLICATE KEY UPDATE
    preset = VALUES(preset),
    provider_reference_column = VALUES(provider_reference_column),
    operation_key_column = VALUES(operation_key_column),
    amount_column = VALUES(amount_column),
    amount_unit = VALUES(amount_unit),
    currency_column = VALUES(currency_column),
    status_column = VALUES(status_column),
    created_column = VALUES(created_column),
    created_format = VALUES(created_format),
    lag_us = VALUES(lag_us),
    updated_at = VALUES(updated_at),
    updated_by = VALUES(updated_by)
