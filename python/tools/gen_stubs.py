"""Regenerates the message stubs the package ships
(``src/jobfence_worker/_proto/coordinator_pb2.py`` and its ``.pyi``) from
the repository's ``proto/``, with grpcio-tools:

    python python/tools/gen_stubs.py

Only the messages are generated: the client calls the service's methods by
name from the file descriptor, for the synchronous and the asyncio channel
alike, so no ``_pb2_grpc`` module (and no grpcio version pin) is needed.
``python/tests/test_stubs.py`` fails when the shipped stubs no longer
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
PROTO_ROOT = os.path.join(HERE, os.pardir, os.pardir, "proto")
PROTO = os.path.join("jobfence", "v1", "coordinator.proto")


def protoc(args: list) -> None:
    from grpc_tools import protoc as _protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    code = _protoc.main(["grpc_tools.protoc", "-I" + PROTO_ROOT, "-I" + well_known, *args,
                         os.path.join(PROTO_ROOT, PROTO)])
    if code != 0:
        raise RuntimeError("protoc failed on %s (exit %d)" % (PROTO, code))


def main() -> None:
    scratch = tempfile.mkdtemp(prefix="jobfence-stubs-")
    try:
        protoc(["--python_out=" + scratch, "--pyi_out=" + scratch])
        for name in ("coordinator_pb2.py", "coordinator_pb2.pyi"):
            shutil.copyfile(os.path.join(scratch, "jobfence", "v1", name),
                            os.path.join(PACKAGE, name))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("wrote", os.path.normpath(PACKAGE), file=sys.stderr)


if __name__ == "__main__":
    main()
