"""The Enqueue and EnqueueBatch both clients send: a fairness key and a
priority go with a job when given, and are left out (the coordinator's
defaults: no key, priority 5) when not. Each item of a batch is a
``(queue, operation_key, payload)`` tuple or a mapping with the keyword
names of ``enqueue``."""

import unittest

from jobfence_worker import _wire


class EnqueueRequestTest(unittest.TestCase):
    def test_the_options_go_with_the_job_when_given(self):
        r = _wire.enqueue_request("refunds", "refund-1", "{}", fairness_key="merchant-7",
                                  priority=8)
        self.assertEqual((r.queue, r.operation_key, r.payload), ("refunds", "refund-1", "{}"))
        self.assertEqual((r.fairness_key, r.priority), ("merchant-7", 8))
        self.assertFalse(r.HasField("delay"))

    def test_without_options_the_coordinator_defaults_apply(self):
        r = _wire.enqueue_request("refunds", "refund-2", "{}", delay_seconds=1.5)
        self.assertEqual((r.fairness_key, r.priority), ("", 0))
        self.assertEqual((r.delay.seconds, r.delay.nanos), (1, 500000000))

    def test_a_batch_takes_tuples_and_mappings(self):
        batch = _wire.enqueue_batch_request([
            ("refunds", "refund-3", "{}"),
            {"queue": "refunds", "operation_key": "refund-4", "payload": "{}",
             "fairness_key": "merchant-8", "priority": 2},
        ])
        sent = [(i.operation_key, i.fairness_key, i.priority) for i in batch.items]
        self.assertEqual(sent, [("refund-3", "", 0), ("refund-4", "merchant-8", 2)])

    def test_an_unknown_option_is_refused_here(self):
        with self.assertRaises(TypeError):
            _wire.enqueue_batch_request([{"queue": "refunds", "operation_key": "k",
                                          "payload": "{}", "fairness": "merchant-8"}])


if __name__ == "__main__":
    unittest.main()
