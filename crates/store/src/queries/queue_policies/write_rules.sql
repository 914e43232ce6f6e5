-- The stored rules a fenced write needs of its queues (a plain read: they
-- change only by an operator's call): the resend policy a Fail's resend is
-- decided on (docs/design.md rule 13), and the provider a throttle report
-- holds. {queues} is a list of placeholders, one per queue.
SELECT queue, provider, resend_window_us, max_dispatches FROM queue_policies WHERE queue IN ({queues})
