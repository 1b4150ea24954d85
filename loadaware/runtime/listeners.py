"""Binding the sidecar's gRPC listeners: a port or an error naming the flag, and TLS files read at start."""

from __future__ import annotations

from collections.abc import Callable

import grpc


def bind(flag: str, address: str, add_port: Callable[[], int], hint: str = "") -> int:
    """A gRPC server's port, or an OSError naming the flag: grpc answers a taken or non-local address with
    port 0 or a RuntimeError ("Failed to bind"), depending on the version."""
    try:
        port = add_port()
    except RuntimeError:
        port = 0
    if not port:
        raise OSError(f"{flag}: cannot bind {address}{hint}")
    return port


def read_pem(flag: str, path: str) -> bytes:
    """A TLS file, or an OSError naming the flag: refused at start, not a traceback from inside the bind."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise OSError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from exc


def add_listener(server: grpc.aio.Server, listen: str, tls_cert: str, tls_key: str, tls_client_ca: str) -> int:
    """Plain text by default (loopback, or a mesh that brings its own mTLS); TLS when a certificate is given,
    mutual TLS when a client CA is too."""
    if not tls_cert:
        return int(server.add_insecure_port(listen))
    pair = (read_pem("--tls-key", tls_key), read_pem("--tls-cert", tls_cert))
    client_ca = read_pem("--tls-client-ca", tls_client_ca) if tls_client_ca else None
    credentials = grpc.ssl_server_credentials([pair], root_certificates=client_ca,
                                              require_client_auth=client_ca is not None)
    return int(server.add_secure_port(listen, credentials))
