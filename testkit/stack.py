"""The whole routing path on loopback: LMCache controller (optional) + fleet + sidecar + Envoy."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from testkit.envoy import EnvoyProc
from testkit.fleet import FleetProc
from testkit.lmcache import LMCacheControllerProc
from testkit.loopback_lock import loopback_lock
from testkit.paths import ENVOY_CONFIG, TINY_TOKENIZER
from testkit.ports import ENVOY_LISTEN_PORT, SIDECAR_PORT, free_port
from testkit.procs import ManagedProc
from testkit.sidecar import SidecarProc, flag_value


class Stack:
    """Started in dependency order on the shipped fixed addresses, torn down in reverse.

    `lmcache=None` means "use it if its venv exists". Everything is stopped even when a later start fails.
    """

    def __init__(self, log_dir: str | os.PathLike[str], *, engines: int = 3, lmcache: bool | None = None,
                 sidecar_args: Sequence[str] = (), sidecar_env: Mapping[str, str] | None = None,
                 fleet_args: Sequence[str] = (), envoy_config: str | os.PathLike[str] = ENVOY_CONFIG,
                 tokenizer: str | os.PathLike[str] = TINY_TOKENIZER, envoy_concurrency: int | None = None,
                 ) -> None:
        self.log_dir = Path(log_dir)
        self.engines = engines
        self.use_lmcache = LMCacheControllerProc.available() if lmcache is None else lmcache
        self.sidecar_args = list(sidecar_args)
        self.sidecar_env = sidecar_env
        self.fleet_args = list(fleet_args)
        self.envoy_config = Path(envoy_config)
        self.tokenizer = Path(tokenizer)
        self.envoy_concurrency = envoy_concurrency
        self.lmcache: LMCacheControllerProc | None = None
        self.fleet: FleetProc | None = None
        self.sidecar: SidecarProc | None = None
        self.envoy: EnvoyProc | None = None
        self._exit = contextlib.ExitStack()

    @property
    def url(self) -> str:
        return self.envoy.url if self.envoy else f"http://127.0.0.1:{ENVOY_LISTEN_PORT}"

    def start(self) -> Self:
        try:
            self._exit.enter_context(loopback_lock())  # released last, after every process is gone
            if self.use_lmcache:
                self.lmcache = self._exit.enter_context(LMCacheControllerProc(self.log_dir))
            self.fleet = self._exit.enter_context(
                FleetProc(self.log_dir, engines=self.engines, tokenizer=self.tokenizer, lmcache=self.lmcache,
                          extra_args=self.fleet_args))
            args = ["--listen", f"127.0.0.1:{SIDECAR_PORT}", "--endpoints", ",".join(self.fleet.endpoints),
                    "--tokenizer", str(self.tokenizer)]
            if flag_value(self.sidecar_args, "--metrics-listen") is None:
                args += ["--metrics-listen", f"127.0.0.1:{free_port()}"]
            if self.lmcache is not None:
                args += ["--lmcache-url", self.lmcache.url]
            self.sidecar = self._exit.enter_context(
                SidecarProc([*args, *self.sidecar_args], env=self.sidecar_env, log_dir=self.log_dir))
            self.envoy = self._exit.enter_context(
                EnvoyProc(self.envoy_config, self.log_dir, concurrency=self.envoy_concurrency))
        except BaseException:
            self._exit.close()
            raise
        return self

    def stop(self) -> None:
        self._exit.close()  # reverse order: envoy, sidecar, fleet, lmcache

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def procs(self) -> Iterator[ManagedProc]:
        for p in (self.envoy, self.sidecar, self.fleet, self.lmcache):
            if p is not None:
                yield p
