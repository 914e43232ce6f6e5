-- Galera only (the variable exists on MariaDB, not on MySQL). SELECT rather
-- than SHOW: SHOW VARIABLES cuts long values, and the pc.* options come
-- late in this one.
SELECT @@GLOBAL.wsrep_provider_options
