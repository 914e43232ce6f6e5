"""Generates the jobfence.v1 stubs from proto/ with grpcio-tools, at run
time, into a scratch directory, and imports them. Generated code is never
committed: the .proto files are the one source of truth.
"""

import os
import shutil
import sys
import tempfile
from importlib import resources

_PROTO = os.path.join("jobfence", "v1", "coordinator.proto")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_loaded = None


def default_proto_root():
    """The repository's proto/ directory."""
    return os.path.join(_REPO, "proto")


def default_out_dir():
    """``$JOBFENCE_PY_STUBS``, else ``.local/pystubs`` in the repository."""
    return os.environ.get("JOBFENCE_PY_STUBS") or os.path.join(_REPO, ".local", "pystubs")


def generate(proto_root, out_dir):
    """Runs protoc (bundled with grpcio-tools) on coordinator.proto.

    Writes into a fresh temporary directory first and renames it into place,
    so two processes generating at once never see half-written modules.
    """
    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".pystubs-", dir=parent)
    try:
        code = protoc.main(
            [
                "grpc_tools.protoc",
                "-I" + proto_root,
                "-I" + well_known,
                "--python_out=" + scratch,
                "--grpc_python_out=" + scratch,
                os.path.join(proto_root, _PROTO),
            ]
        )
        if code != 0:
            raise RuntimeError("protoc failed on %s (exit %d)" % (_PROTO, code))
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir, ignore_errors=True)
        try:
            os.rename(scratch, out_dir)
        except OSError:
            # Another process won the race; its stubs are the same.
            if not os.path.isdir(out_dir):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _stale(proto_root, out_dir):
    generated = os.path.join(out_dir, "jobfence", "v1", "coordinator_pb2.py")
    if not os.path.exists(generated):
        return True
    return os.path.getmtime(generated) < os.path.getmtime(os.path.join(proto_root, _PROTO))


def load(proto_root=None, out_dir=None):
    """Returns ``(coordinator_pb2, coordinator_pb2_grpc)``, generating them
    first if missing or older than the .proto."""
    global _loaded
    if _loaded is not None:
        return _loaded
    proto_root = proto_root or default_proto_root()
    out_dir = out_dir or default_out_dir()
    if _stale(proto_root, out_dir):
        generate(proto_root, out_dir)
    if out_dir not in sys.path:
        sys.path.insert(0, out_dir)
    from jobfence.v1 import coordinator_pb2, coordinator_pb2_grpc

    _loaded = (coordinator_pb2, coordinator_pb2_grpc)
    return _loaded
