"""The message stubs the package ships describe proto/ exactly: compiled
afresh with grpcio-tools, coordinator.proto and errors.proto must give the
same file descriptors as the ones in ``_proto/coordinator_pb2.py`` and
``_proto/errors_pb2.py``. When it fails, run
``python sdk/python/tools/gen_stubs.py`` and commit the result."""

import os
import tempfile
import unittest
from importlib import resources

from google.protobuf import descriptor_pb2

from jobfence_worker._proto import coordinator_pb2, errors_pb2

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir)


def without_json_names(fd):
    """protoc leaves the derived json_name out of Python stubs."""
    def strip(messages):
        for m in messages:
            for f in m.field:
                f.ClearField("json_name")
            strip(m.nested_type)
    strip(fd.message_type)
    for f in fd.extension:
        f.ClearField("json_name")
    return fd


class StubsTest(unittest.TestCase):
    def check(self, proto, stub):
        from grpc_tools import protoc

        well_known = str(resources.files("grpc_tools") / "_proto")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "fds.bin")
            code = protoc.main(["protoc", "-I" + os.path.join(REPO, "proto"), "-I" + well_known,
                                "--descriptor_set_out=" + out,
                                os.path.join(REPO, "proto", "jobfence", "v1", proto)])
            self.assertEqual(code, 0)
            with open(out, "rb") as f:
                fresh = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file[0]
        shipped = descriptor_pb2.FileDescriptorProto.FromString(stub.DESCRIPTOR.serialized_pb)
        self.assertEqual(without_json_names(shipped), without_json_names(fresh), "sdk/python/src/jobfence_worker/_proto is stale: "
                         "run python sdk/python/tools/gen_stubs.py")

    def test_shipped_stubs_match_proto(self):
        self.check("coordinator.proto", coordinator_pb2)

    def test_shipped_reasons_match_errors_proto(self):
        self.check("errors.proto", errors_pb2)


if __name__ == "__main__":
    unittest.main()
