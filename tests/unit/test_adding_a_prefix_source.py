"""docs/architecture.md, "Adding a prefix source": the worked example, taken from the document as written, is one
module and one registry line, and with nothing else the flag accepts it, --help and configuration.md name it,
the combination rules apply to it, and a sidecar built on it asks it and routes by its answer."""

from __future__ import annotations

import asyncio
import re

import pytest

import loadaware.prefix.registry as registry
from loadaware.app import Sidecar
from loadaware.config import SETTINGS_BY_NAME, ConfigError, from_args
from loadaware.prefix.spec import SourceSpec
from loadaware.routing.request import InferenceRequest
from testkit import config_doc
from testkit.doc_examples import example_module

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")


def register_the_example(monkeypatch: pytest.MonkeyPatch) -> SourceSpec:
    module, registry_line = example_module(monkeypatch, "Adding a prefix source", "loadaware.prefix.sources.hash_ring")
    entry = re.fullmatch(r"\s*(\w+),\s*", registry_line)
    assert entry is not None, registry_line
    spec = module.__dict__[entry[1]]
    assert isinstance(spec, SourceSpec)
    monkeypatch.setitem(registry.SOURCES, spec.name, spec)
    return spec


def test_the_documented_source_is_one_module_and_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = register_the_example(monkeypatch)
    assert spec.name in SETTINGS_BY_NAME["prefix_source"].help  # --help
    assert spec.name in config_doc.render()  # docs/configuration.md, once regenerated
    settings = from_args(["--prefix-source", spec.name, "--endpoints", ",".join(FLEET), "--metrics-listen", "off"],
                         environ={})
    assert settings.prefix_sources == (spec.name,)
    with pytest.raises(ConfigError, match="both guesses"):  # the combination rules read its declaration
        from_args(["--prefix-source", f"approx,{spec.name}", "--endpoints", FLEET[0]], environ={})
    assert from_args(["--endpoints", FLEET[0]], environ={}).prefix_sources == ("approx",)  # not in `auto`

    app = Sidecar(settings)
    try:
        assert app.prefixes.names == (spec.name,) and app.prefixes.text_will_do
        prompt = "the same long system prompt, sent again and again " * 40
        first = asyncio.run(app.decider.decide(InferenceRequest("completions", prompt=prompt), "r1"))
        held = {c.endpoint: c.matched_tokens for c in first.candidates if c.matched_tokens}
        assert len(held) == 1 and first.endpoint in held  # it answered: one engine holds the head, and is chosen
        assert app.prefixes.state()["sources"] == [spec.name]
    finally:
        asyncio.run(app.prefixes.close())
