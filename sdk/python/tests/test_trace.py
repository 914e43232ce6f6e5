"""The caller's trace context in each call's metadata (``_wire.call_metadata``),
with and without the optional ``opentelemetry`` API package."""

import unittest
from unittest import mock

from jobfence_worker import _wire

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class FakePropagate:
    """What ``opentelemetry.propagate`` does inside a span: writes the
    context into the carrier."""

    @staticmethod
    def inject(carrier):
        carrier["traceparent"] = TRACEPARENT
        carrier["tracestate"] = "vendor=v1"


class OutsideATrace:
    @staticmethod
    def inject(carrier):
        pass


class CallMetadataTest(unittest.TestCase):
    def test_without_opentelemetry_the_metadata_is_the_tokens(self):
        with mock.patch.object(_wire, "_otel_propagate", None):
            self.assertEqual(_wire.call_metadata(None), None)
            token = (("authorization", "Bearer t"),)
            self.assertEqual(_wire.call_metadata(token), token)

    def test_inside_a_trace_the_traceparent_goes_along(self):
        with mock.patch.object(_wire, "_otel_propagate", FakePropagate):
            got = _wire.call_metadata((("authorization", "Bearer t"),))
        self.assertEqual(got, (("authorization", "Bearer t"), ("traceparent", TRACEPARENT),
                               ("tracestate", "vendor=v1")))

    def test_outside_a_trace_nothing_is_added(self):
        with mock.patch.object(_wire, "_otel_propagate", OutsideATrace):
            self.assertEqual(_wire.call_metadata(None), None)


if __name__ == "__main__":
    unittest.main()
