"""Configuration: flag > env > default, 0 is valid, garbage env falls back, bad flags are refused."""

from __future__ import annotations

import logging

import pytest

from loadaware.config import ConfigError, from_args, resolve
from loadaware.fleet.addresses import parse_instance_map


def test_beta_default() -> None:
    s = from_args([], environ={})
    assert s.loadaware_beta == 1.0 and s.origins["loadaware_beta"] == "default"


def test_beta_env_over_default_and_flag_over_env() -> None:
    assert from_args([], environ={"LOADAWARE_BETA": "0.5"}).loadaware_beta == 0.5
    s = from_args(["--loadaware-beta", "2"], environ={"LOADAWARE_BETA": "0.5"})
    assert s.loadaware_beta == 2.0 and s.origins["loadaware_beta"] == "flag"


def test_beta_zero_is_valid_everywhere() -> None:
    assert from_args(["--loadaware-beta", "0"], environ={}).loadaware_beta == 0.0
    s = from_args([], environ={"LOADAWARE_BETA": "0"})
    assert s.loadaware_beta == 0.0 and s.origins["loadaware_beta"] == "env"


@pytest.mark.parametrize("garbage", ["abc", "nan", "-1", "inf", "1,5"])
def test_beta_env_garbage_falls_back_with_warning(garbage: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        s = from_args([], environ={"LOADAWARE_BETA": garbage})
    assert s.loadaware_beta == 1.0 and s.origins["loadaware_beta"] == "default"
    assert "LOADAWARE_BETA" in caplog.text


@pytest.mark.parametrize("argv, flag", [
    (["--loadaware-beta", "abc"], "--loadaware-beta"),
    (["--loadaware-beta", "-0.5"], "--loadaware-beta"),
    (["--policy", "random"], "--policy"),
    (["--listen", "nohost"], "--listen"),
    (["--endpoints", "10.0.0.1"], "--endpoints"),
    (["--endpoints", "10.0.0.1:99999"], "--endpoints"),
    (["--lmcache-url", "ftp://x"], "--lmcache-url"),
    (["--lmcache-instance-map", "engine-a"], "--lmcache-instance-map"),
    (["--metrics-listen", "x:y"], "--metrics-listen"),
    (["--destination-header", "bad header"], "--destination-header"),
    (["--scrape-interval-s", "0"], "--scrape-interval-s"),
    (["--endpoints", "1.2.3.4:80", "--endpoints-file", "/tmp/x"], "--endpoints-file"),
])
def test_bad_flags_are_refused_naming_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        from_args(argv, environ={})


def test_endpoints_and_maps_parse() -> None:
    s = from_args(["--endpoints", "127.0.0.2:8000, 127.0.0.3:8000,127.0.0.2:8000"], environ={})
    assert s.endpoints == ("127.0.0.2:8000", "127.0.0.3:8000")
    assert parse_instance_map("engine-a=127.0.0.2:8000,engine-b=127.0.0.3:8000") == {
        "engine-a": "127.0.0.2:8000", "engine-b": "127.0.0.3:8000"}
    s = from_args([], environ={"LOADAWARE_POLICY": "kvaware", "LOADAWARE_ENDPOINTS": "1.1.1.1:1"})
    assert s.policy == "kvaware" and s.endpoints == ("1.1.1.1:1",)
    assert {d["name"]: d["origin"] for d in s.describe()}["policy"] == "env"


def test_defaults_match_the_contract() -> None:
    s = from_args([], environ={})
    assert s.listen == "127.0.0.1:9002"
    assert s.policy == "auto" and s.effective_policy == "loadaware"  # policies/auto.py
    assert "held-out" in s.policy_reason
    with_tokenizer = from_args(["--tokenizer", "/models/tokenizer.json"], environ={})
    assert with_tokenizer.effective_policy == "loadaware"
    shown = {d["name"]: d["value"] for d in with_tokenizer.describe()}["policy"]
    assert shown.startswith("loadaware (auto: ")  # GetConfig says what auto chose and why
    # ... and which prefix sources the default uses, and why: with LMCache and a tokenizer, the record beside it
    lmc = from_args(["--tokenizer", "/models/tokenizer.json", "--lmcache-url", "http://127.0.0.1:1"], environ={})
    sources = {d["name"]: d["value"] for d in lmc.describe()}["prefix_source"]
    assert sources.startswith("lmcache,approx (default: ") and "holder" in sources
    assert {d["name"]: d["value"] for d in s.describe()}["prefix_source"].startswith("approx (default: ")
    chosen = from_args(["--tokenizer", "/models/tokenizer.json", "--policy", "loadaware"], environ={})
    assert chosen.effective_policy == "loadaware" and chosen.policy_reason == "--policy loadaware"
    assert s.destination_header == "x-gateway-destination-endpoint"


@pytest.mark.parametrize(("env", "value"), [
    ("LOADAWARE_LISTEN", "nowhere"), ("LOADAWARE_METRICS_LISTEN", "127.0.0.1:99999"),
    ("LOADAWARE_ADMIN_LISTEN", "localhost"),
    ("LOADAWARE_EJECT_AFTER_FAILURES", "-1"), ("LOADAWARE_EJECTION_BASE_S", "soon"),
    ("LOADAWARE_MAX_EJECTION_PERCENT", "150"),
    # a typo that would otherwise route with another policy, another prefix source or none at all
    ("LOADAWARE_POLICY", "nonsense"), ("LOADAWARE_PREFIX_SOURCE", "lmcahce"),
    ("LOADAWARE_LMCACHE_URL", "127.0.0.1:9000"), ("LOADAWARE_ENVOY_ADMIN_URL", "envoy:9901"),
    ("LOADAWARE_DISCOVERY", "k8s"), ("LOADAWARE_ENDPOINTS", "engine-a"),
    ("LOADAWARE_KV_EVENTS_BIND", "nowhere"),
])
def test_bad_listener_tls_or_ejection_env_values_are_refused_at_start(env: str, value: str) -> None:
    with pytest.raises(ConfigError, match=env):
        resolve({}, {env: value})


def test_max_ejection_percent_flag_env_default() -> None:
    assert resolve({}, {}).max_ejection_percent == 50.0
    assert resolve({}, {"LOADAWARE_MAX_EJECTION_PERCENT": "100"}).max_ejection_percent == 100.0
    assert resolve({"max_ejection_percent": "0"}, {"LOADAWARE_MAX_EJECTION_PERCENT": "100"}).max_ejection_percent == 0
