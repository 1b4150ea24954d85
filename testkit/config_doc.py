"""docs/configuration.md, rendered from the sidecar's one settings table (`loadaware.config.SETTINGS`).

    python -m testkit.config_doc > docs/configuration.md

`tests/unit/test_docs.py` fails while the checked-in file differs from `render()`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any

from loadaware.config import SETTINGS, Setting

COMMAND = "python -m testkit.config_doc > docs/configuration.md"

PREAMBLE = f"""\
# Configuration

<!-- Generated from loadaware/config.py (SETTINGS) by `{COMMAND}`; do not edit by hand. -->

Every setting of `loadaware-sidecar serve` has a flag and an environment variable. Precedence: **flag >
environment > default** (`loadaware/config.py`, `resolve`); an environment variable set to an empty string
counts as unset. `loadaware-sidecar config` (and the debug API's `GetConfig`) prints the effective value of
each setting and where it came from (`flag`, `env` or `default`).

- A bad flag value is refused at start, with a message naming the flag.
- A bad environment value of a *strict* setting is refused at start like a flag: a listener on an address the
  operator did not mean, a TLS file silently dropped or an ejection rule quietly reset would change the pod's
  exposure or failure behaviour without a sign. A bad environment value of any other setting (a tuning knob)
  logs a warning and the default is used. The last column says which.
- Some combinations are refused at start with a message naming the setting: `--prefix-source lmcache` without
  `--lmcache-url`, `--kv-events-bind` without the `kv-events` prefix source, `--endpoints` together with
  `--endpoints-file`, a discovery mode without what it needs (`--discovery kubernetes` without
  `--k8s-service`, say), two listeners on one port, `--scrape-stale-s` below `--scrape-interval-s`,
  `--ejection-max-s` below `--ejection-base-s`, `--tls-cert` without `--tls-key` (or the reverse), and
  `--tls-client-ca` without both.
- Listener settings take `HOST:PORT` (IPv6 as `[::1]:PORT`); `off` disables any of them but `--listen`.

| flag | environment variable | default | meaning | bad environment value |
|---|---|---|---|---|
"""

_FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9-]*[a-z0-9])")


def format_default(value: Any) -> str:
    """A default as an operator would type it; an empty value is shown as `(none)`, None (sized at run time) as
    `auto`."""
    if value is None:
        return "`auto`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (tuple, list)):
        value = ",".join(map(str, value))
    elif isinstance(value, Mapping):
        value = ",".join(f"{k}={v}" for k, v in value.items())
    text = str(value)
    return f"`{text}`" if text else "(none)"


def cell(text: str) -> str:
    """Markdown table cell text: pipes escaped, flags in code spans."""
    return _FLAG.sub(r"`\1`", text.replace("|", "\\|"))


def row(s: Setting) -> str:
    on_bad_env = "refused at start" if s.strict else "warning, default used"
    return (f"| `{s.flag}` | `{s.env}` | {format_default(s.default)} | {cell(s.help)} | {on_bad_env} |")


def render() -> str:
    """The whole of docs/configuration.md."""
    return PREAMBLE + "\n".join(row(s) for s in SETTINGS) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
