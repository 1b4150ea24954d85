"""Every prefix source `--prefix-source` can select: one line each, in the canonical order a selection is kept
in (the flag's order does not matter). The flag's parser and help, `auto`, the combination rules and the
wiring read this table (docs/architecture.md, "Adding a prefix source")."""

from __future__ import annotations

from loadaware.prefix.sources.approx import APPROX
from loadaware.prefix.sources.kv_events import KV_EVENTS
from loadaware.prefix.sources.lmcache import LMCACHE
from loadaware.prefix.spec import SourceSpec, options_of

SOURCES: dict[str, SourceSpec] = {spec.name: spec for spec in (
    LMCACHE,
    KV_EVENTS,
    APPROX,
)}


def default_sources(settings: object, have_tokenizer: bool) -> tuple[str, ...]:
    """What `auto` selects: every source whose options say so, if it can be asked (a tokenizer when it needs
    one)."""
    return tuple(name for name, spec in SOURCES.items()
                 if spec.default(options_of(spec, settings)) and (have_tokenizer or not spec.needs_tokenizer))


def default_reason(settings: object, have_tokenizer: bool) -> str:
    """Why `auto` selected what it did, in words (GetConfig, the start's log line)."""
    for spec in SOURCES.values():
        if spec.exact and spec.default(options_of(spec, settings)):
            if not have_tokenizer and spec.needs_tokenizer:
                return (f"default: no tokenizer, so {spec.title or spec.name} cannot be asked; the sidecar's record "
                        "guesses from text")
            if spec.why_default:
                return f"default: {spec.why_default}"
    return "default: no exact source configured; the sidecar's record of where it sent each prefix"


def selection_problem(names: tuple[str, ...], settings: object) -> str | None:
    """The first reason the sources `names` cannot run with these settings (None: they can)."""
    for name, spec in SOURCES.items():
        problem = spec.check(options_of(spec, settings), name in names)
        if problem:
            return problem
    guesses = [name for name in names if not SOURCES[name].exact]
    if len(guesses) > 1:
        return f"--prefix-source: {' and '.join(guesses)} are both guesses; choose one"
    return None


def prefix_source_help() -> str:
    """--prefix-source's help, from the table: a source registered there is named here."""
    auto = ", ".join(spec.auto_help for spec in SOURCES.values() if spec.auto_help)
    return f"{' | '.join(SOURCES)}, or a comma combination (default auto: {auto})"
