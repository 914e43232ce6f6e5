-- Transactions still open that began at or before the given time and may
-- write: one of them may own an event id that is missing (allocated, not
-- yet committed). trx_started has whole seconds only, which errs on the
-- side of waiting. Read-only transactions and autocommit SELECTs cannot
-- insert, and this very session is not one to wait for.
SELECT COUNT(*) AS n
FROM information_schema.INNODB_TRX
WHERE trx_started <= ?
  AND trx_is_read_only = 0
  AND trx_autocommit_non_locking = 0
  AND trx_mysql_thread_id <> CONNECTION_ID()
