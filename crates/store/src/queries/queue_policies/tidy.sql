-- Queue rows that hold neither a provider nor a policy are removed, in the
-- transaction of the change that emptied them: only the rows of the queues
-- that change touched ({queues}, one placeholder per queue), read by their
-- primary key. A DELETE that read the whole table would wait for the
-- queue rows other transactions hold: a claim holds its provider's queue
-- rows (budget/rules.sql), and one waiting for the very row this change
-- holds would close a cycle.
DELETE FROM queue_policies
WHERE queue IN ({queues}) AND provider IS NULL AND resend_window_us IS NULL
  AND job_retention_us IS NULL AND amount_pointer IS NULL AND currency_pointer IS NULL
  AND paused_at IS NULL
