-- Queue rows that hold neither a provider nor a policy are removed, in the
-- transaction of the change that emptied them.
DELETE FROM queue_policies WHERE provider IS NULL AND resend_window_us IS NULL AND job_retention_us IS NULL
  AND amount_pointer IS NULL AND currency_pointer IS NULL AND paused_at IS NULL
