"""The gRPC port over TLS and mutual TLS (gateways such as Envoy Gateway and kgateway dial their picker with
TLS); plain text stays the default."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loadaware.app import Sidecar
from loadaware.config import ConfigError, from_args
from testkit.certs import CertFiles, make_certs
from testkit.ports import free_port

FLEET = "127.0.0.2:18000"


@pytest.fixture
def certs(tmp_path: Path) -> CertFiles:
    return make_certs(tmp_path / "certs")


async def serve(*flags: str) -> tuple[Sidecar, str]:
    addr = f"127.0.0.1:{free_port()}"
    # no admin listeners: their fixed loopback defaults would collide with other runs on this machine
    app = Sidecar(from_args(["--listen", addr, "--endpoints", FLEET, "--metrics-listen", "off", "--admin-listen", "off",
                             "--admin-http-listen", "off", *flags], environ={}))
    await app.start()
    return app, addr


@pytest.fixture
async def stop_after() -> AsyncIterator[list[Sidecar]]:
    apps: list[Sidecar] = []
    yield apps
    for app in apps:
        await app.stop()


async def liveness(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="liveness"),
                                                            timeout=5)
    return int(reply.status)


def credentials(certs: CertFiles, client: bool) -> grpc.ChannelCredentials:
    if not client:
        return grpc.ssl_channel_credentials(root_certificates=certs.ca.read_bytes())
    return grpc.ssl_channel_credentials(root_certificates=certs.ca.read_bytes(),
                                        private_key=certs.client_key.read_bytes(),
                                        certificate_chain=certs.client_cert.read_bytes())


async def test_tls_serves_verified_clients_and_refuses_plain_text(certs: CertFiles, stop_after: list[Sidecar]) -> None:
    app, addr = await serve("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    stop_after.append(app)
    async with grpc.aio.secure_channel(addr, credentials(certs, client=False)) as channel:
        assert await liveness(channel) == health_pb2.HealthCheckResponse.SERVING
    async with grpc.aio.insecure_channel(addr) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await liveness(channel)


async def test_mutual_tls_requires_a_client_certificate(certs: CertFiles, stop_after: list[Sidecar]) -> None:
    app, addr = await serve("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                            "--tls-client-ca", str(certs.ca))
    stop_after.append(app)
    async with grpc.aio.secure_channel(addr, credentials(certs, client=True)) as channel:
        assert await liveness(channel) == health_pb2.HealthCheckResponse.SERVING
    async with grpc.aio.secure_channel(addr, credentials(certs, client=False)) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await liveness(channel)


def test_tls_settings_go_together(certs: CertFiles) -> None:
    with pytest.raises(ConfigError, match="--tls-key"):
        from_args(["--endpoints", FLEET, "--tls-cert", str(certs.server_cert)], environ={})
    with pytest.raises(ConfigError, match="--tls-client-ca"):
        from_args(["--endpoints", FLEET, "--tls-client-ca", str(certs.ca)], environ={})


async def test_an_unreadable_tls_file_is_refused_at_start_naming_the_flag(certs: CertFiles, tmp_path: Path) -> None:
    missing = tmp_path / "gone.pem"
    app = Sidecar(from_args(["--listen", f"127.0.0.1:{free_port()}", "--endpoints", FLEET, "--metrics-listen", "off",
                             "--admin-listen", "off", "--admin-http-listen", "off",
                             "--tls-cert", str(certs.server_cert), "--tls-key", str(missing)], environ={}))
    try:
        with pytest.raises(OSError, match=f"^--tls-key: cannot read {missing}"):
            await app.start()
    finally:
        await app.stop()


async def test_plain_text_health_port_beside_a_tls_grpc_port(certs: CertFiles, stop_after: list[Sidecar]) -> None:
    # kubelet's gRPC probes speak no TLS: --health-listen serves only grpc.health.v1, in plain text.
    health_addr = f"127.0.0.1:{free_port()}"
    app, _addr = await serve("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                            "--health-listen", health_addr)
    stop_after.append(app)
    async with grpc.aio.insecure_channel(health_addr) as channel:
        assert await liveness(channel) == health_pb2.HealthCheckResponse.SERVING
        # the same readiness as the main port (no scrape round yet: NOT_SERVING), and nothing but health
        ready = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
        assert ready.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary("/loadaware.v1.Router/GetConfig")(b"", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
