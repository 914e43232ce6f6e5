"""How a worker reaches a coordinator that runs with TLS and
authentication: the CA to trust, an optional client certificate (mutual
TLS), and a bearer token sent as ``authorization: Bearer ...`` metadata on
every call. ``Credentials.from_env()`` reads the same environment variables
as every jobfence client (Rust, Node, the ``jobfence`` command line):

* ``JOBFENCE_TLS_CA``: path of the CA certificate (PEM) that signed the
  coordinator's; set, the client speaks TLS;
* ``JOBFENCE_TLS_CLIENT_CERT`` and ``JOBFENCE_TLS_CLIENT_KEY``: a client
  certificate and its key (PEM), for mutual TLS;
* ``JOBFENCE_TOKEN_FILE``: a file whose first line is the bearer token (or
  ``JOBFENCE_TOKEN``: the token itself).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import grpc
from grpc import aio


@dataclass(frozen=True)
class Credentials:
    """TLS settings and a bearer token; all empty for a coordinator run with
    ``--insecure``. The token never shows in ``repr``."""

    tls_ca_pem: Optional[bytes] = None
    tls_client_pem: Optional[Tuple[bytes, bytes]] = None
    token: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_env(cls) -> "Credentials":
        """Reads the ``JOBFENCE_*`` variables above; unset ones leave their
        part out, a named file that cannot be read raises ``OSError``."""

        def var(name: str) -> Optional[str]:
            return os.environ.get(name) or None

        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        ca = var("JOBFENCE_TLS_CA")
        cert, key = var("JOBFENCE_TLS_CLIENT_CERT"), var("JOBFENCE_TLS_CLIENT_KEY")
        if (cert is None) != (key is None):
            raise ValueError("set both JOBFENCE_TLS_CLIENT_CERT and JOBFENCE_TLS_CLIENT_KEY, or neither")
        token_file = var("JOBFENCE_TOKEN_FILE")
        if token_file:
            lines = read(token_file).decode().splitlines()
            token: Optional[str] = lines[0].strip() if lines else ""
            if not token:
                raise ValueError("the token file %s is empty" % token_file)
        else:
            token = var("JOBFENCE_TOKEN")
        return cls(
            tls_ca_pem=read(ca) if ca else None,
            tls_client_pem=(read(cert), read(key)) if cert and key else None,
            token=token,
        )

    def metadata(self) -> List[Tuple[str, str]]:
        """The call metadata carrying the token (empty without one)."""
        return [("authorization", "Bearer " + self.token)] if self.token else []

    def _ssl(self) -> grpc.ChannelCredentials:
        key, cert = (self.tls_client_pem[1], self.tls_client_pem[0]) if self.tls_client_pem else (None, None)
        return grpc.ssl_channel_credentials(root_certificates=self.tls_ca_pem,
                                            private_key=key, certificate_chain=cert)

    def channel(self, target: str) -> grpc.Channel:
        """A synchronous channel to ``target`` (``host:port``): TLS when a CA
        is set (``grpc.secure_channel``), cleartext otherwise."""
        target = _host_port(target)
        if self.tls_ca_pem is not None:
            return grpc.secure_channel(target, self._ssl(), options=_options())
        return grpc.insecure_channel(target, options=_options())

    def aio_channel(self, target: str) -> aio.Channel:
        """As ``channel``, on ``grpc.aio``."""
        target = _host_port(target)
        if self.tls_ca_pem is not None:
            return aio.secure_channel(target, self._ssl(), options=_options())
        return aio.insecure_channel(target, options=_options())


def _options() -> List[Tuple[str, str]]:
    """The channel options: this client named first in the user-agent
    (``jobfence-python/VERSION``), which the coordinator's workers view shows."""
    from . import __version__  # the package is loaded by the time a channel is made
    return [("grpc.primary_user_agent", "jobfence-python/" + __version__)]


def _host_port(target: str) -> str:
    for scheme in ("http://", "https://"):
        if target.startswith(scheme):
            return target[len(scheme):]
    return target


__all__ = ["Credentials"]
