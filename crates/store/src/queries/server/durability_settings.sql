-- The settings that decide whether an acknowledged commit survives a crash
-- (docs/design.md rule 9). SHOW rather than SELECT @@GLOBAL.…: a variable the
-- server does not have (wsrep_on on MySQL) is simply absent here, where
-- @@GLOBAL would fail the whole statement. Needs no privilege.
SHOW GLOBAL VARIABLES WHERE Variable_name IN (
  'innodb_flush_log_at_trx_commit',
  'log_bin',
  'sync_binlog',
  'wsrep_on'
)
