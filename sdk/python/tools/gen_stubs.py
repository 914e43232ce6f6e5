"""Regenerates the message stubs the package ships
(``src/jobfence_worker/_proto/coordinator_pb2.py``, ``errors_pb2.py`` and
their ``.pyi``) from the repository's ``proto/``, with grpcio-tools:

    python sdk/python/tools/gen_stubs.py

Only the messages are generated: the client calls the service's methods by
name from the file descriptor, for the synchronous and the asyncio channel
alike, so no ``_pb2_grpc`` module (and no grpcio version pin) is needed.
``errors_pb2`` carries the enum ``ErrorReason`` from which ``REASONS``
(``jobfence_worker.errors``) is built: every reason a coordinator sends.
``sdk/python/tests/test_stubs.py`` fails when the shipped stubs no longer
describe ``proto/``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from importlib import resources

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, os.pardir, "src", "jobfence_worker", "_proto")
PROTO_ROOT = os.path.join(HERE, os.pardir, os.pardir, os.pardir, "proto")
# The files the package ships stubs of (the client speaks JobCoordinator;
# errors.proto lists the ErrorInfo reasons).
PROTOS = [os.path.join("jobfence", "v1", name) for name in ("coordinator.proto", "errors.proto")]


def protoc(args: list) -> None:
    from grpc_tools import protoc as _protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    code = _protoc.main(["grpc_tools.protoc", "-I" + PROTO_ROOT, "-I" + well_known, *args,
                         *(os.path.join(PROTO_ROOT, p) for p in PROTOS)])
    if code != 0:
        raise RuntimeError("protoc failed on %s (exit %d)" % (", ".join(PROTOS), code))


def main() -> None:
    scratch = tempfile.mkdtemp(prefix="jobfence-stubs-")
    try:
        protoc(["--python_out=" + scratch, "--pyi_out=" + scratch])
        for proto in PROTOS:
            stem = os.path.splitext(os.path.basename(proto))[0] + "_pb2"
            for name in (stem + ".py", stem + ".pyi"):
                shutil.copyfile(os.path.join(scratch, "jobfence", "v1", name),
                                os.path.join(PACKAGE, name))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("wrote", os.path.normpath(PACKAGE), file=sys.stderr)


if __name__ == "__main__":
    main()
