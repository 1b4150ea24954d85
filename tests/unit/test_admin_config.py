"""The admin listeners' settings: loopback defaults apart from every other port, 'off', flag > env, each
listener on an address of its own; and what counts as loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loadaware.api.admin import REFLECTED_SERVICES, is_loopback
from loadaware.config import ConfigError, from_args

FLEET = "10.0.0.1:8000"
REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_loopback_ports_of_their_own() -> None:
    s = from_args(["--endpoints", FLEET], environ={})
    assert (s.admin_listen, s.admin_http_listen) == ("127.0.0.1:9004", "127.0.0.1:9005")
    assert is_loopback(s.admin_listen) and is_loopback(s.admin_http_listen)
    ports = {int(a.rpartition(":")[2]) for a in (s.listen, s.metrics_listen, s.admin_listen, s.admin_http_listen)}
    assert len(ports) == 4
    # the plain-text health port the Envoy Gateway variant serves (k8s/.../picker-tls-patch.yaml) is not ours
    patch = yaml.safe_load((REPO / "k8s/inference-pool/envoy-gateway/picker-tls-patch.yaml").read_text())
    env = {e["name"]: e["value"] for e in patch["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert int(env["LOADAWARE_HEALTH_LISTEN"].rpartition(":")[2]) not in ports


def test_off_flag_and_environment() -> None:
    s = from_args(["--endpoints", FLEET, "--admin-listen", "off", "--admin-http-listen", "none"], environ={})
    assert s.admin_listen == "" and s.admin_http_listen == ""
    s = from_args(["--endpoints", FLEET], environ={"LOADAWARE_ADMIN_LISTEN": "127.0.0.1:19004",
                                                   "LOADAWARE_ADMIN_HTTP_LISTEN": "off"})
    assert s.admin_listen == "127.0.0.1:19004" and s.origins["admin_listen"] == "env"
    assert s.admin_http_listen == ""
    s = from_args(["--endpoints", FLEET, "--admin-listen", "127.0.0.1:29004"],
                  environ={"LOADAWARE_ADMIN_LISTEN": "127.0.0.1:19004"})
    assert s.admin_listen == "127.0.0.1:29004" and s.origins["admin_listen"] == "flag"
    with pytest.raises(ConfigError, match=r"^--admin-listen"):
        from_args(["--endpoints", FLEET, "--admin-listen", "nope"], environ={})


@pytest.mark.parametrize(("flags", "refused"), [
    (["--admin-listen", "127.0.0.1:9002"], "--admin-listen: 127.0.0.1:9002 is also --listen's address"),
    (["--admin-http-listen", "127.0.0.1:9102"], "--admin-http-listen: 127.0.0.1:9102 is also --metrics-listen's"),
    (["--admin-http-listen", "127.0.0.1:9004"], "--admin-http-listen: 127.0.0.1:9004 is also --admin-listen's"),
    (["--listen", "0.0.0.0:9004"], "--admin-listen: 127.0.0.1:9004 is also --listen's"),  # a wildcard takes them all
    (["--health-listen", "0.0.0.0:9003", "--admin-listen", "127.0.0.1:9003"], "--admin-listen: .* --health-listen"),
])
def test_each_listener_needs_its_own_address(flags: list[str], refused: str) -> None:
    with pytest.raises(ConfigError, match=refused):
        from_args(["--endpoints", FLEET, *flags], environ={})


def test_addresses_that_do_not_clash() -> None:
    # another host on the same port, port 0 (any free port), or a listener that is off
    from_args(["--endpoints", FLEET, "--listen", "127.0.0.2:9004"], environ={})
    from_args(["--endpoints", FLEET, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--admin-listen", "127.0.0.1:0", "--admin-http-listen", "127.0.0.1:0"], environ={})
    from_args(["--endpoints", FLEET, "--metrics-listen", "off", "--admin-http-listen", "127.0.0.1:9102"], environ={})


@pytest.mark.parametrize(("listen", "loopback"), [
    ("127.0.0.1:9004", True), ("127.1.2.3:9004", True), ("localhost:9004", True), ("[::1]:9004", True),
    ("0.0.0.0:9004", False), ("[::]:9004", False), ("10.0.0.7:9004", False), ("gateway.llm:9004", False),
])
def test_what_counts_as_loopback(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


def test_reflection_on_the_admin_port_names_no_ext_proc() -> None:
    assert "envoy.service.ext_proc.v3.ExternalProcessor" not in REFLECTED_SERVICES
    assert set(REFLECTED_SERVICES) == {"loadaware.v1.Router", "grpc.health.v1.Health",
                                       "grpc.reflection.v1alpha.ServerReflection"}
