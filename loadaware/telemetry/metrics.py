"""Every Prometheus metric the sidecar exports, declared here and in the two family groups Metrics mixes in
(telemetry/prefix_metrics.py, telemetry/flow_metrics.py).

Label children are cached: the hot path pays a dictionary lookup and an increment, not a label parse. The
per-endpoint gauges and counters are TableGauges and TableCounters (telemetry/table_series.py): plain numbers the
garbage collector never walks, which write their own /metrics text (telemetry/exposition.py, the registry's
`render`) instead of a prometheus_client Sample per series.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loadaware.telemetry.exposition import TextRegistry
from loadaware.telemetry.flow_metrics import FlowControlFamilies
from loadaware.telemetry.prefix_metrics import PrefixIndexFamilies
from loadaware.telemetry.table_series import TableCounter, TableGauge

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
STAGES = ("parse", "tokenize", "lookup", "state", "score")
ROUTING_STATES = ("healthy", "ejected", "probing")


class Metrics(PrefixIndexFamilies, FlowControlFamilies):
    """The sidecar's families, declared in groups by concern (the order of their declaration is the order of
    /metrics, which the golden list checks); the KV-event and approximate indexes' families and admission's
    are groups of their own modules, mixed in."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.registry = TextRegistry(auto_describe=True)  # renders the per-endpoint tables' text itself
        r = self.registry
        self._declare_decision_families(r)
        self._declare_load_families(r)
        self._declare_cache_families(r)
        self._declare_request_families(r)
        self._declare_endpoint_families(r)
        self._declare_prefix_index_metrics(r)
        self._declare_flow_control_metrics(r)
        self._model_labels: dict[str, frozenset[str]] = {}
        # What the per-endpoint gauges set at render time show now, so a render at 10,000 endpoints only
        # touches the series that changed (set from the render thread; forget_endpoint clears them).
        self._state_shown: dict[str, str] = {}
        self._inflight_shown: dict[str, int] = {}
        # Counter series an endpoint has besides its gauges, so its departure removes them all
        # (endpoint -> (index into _endpoint_tables, label values)...): tuples of strings and ints, which the
        # garbage collector does not track either.
        self._endpoint_series: dict[str, tuple[tuple[int, tuple[str, ...]], ...]] = {}
        self._endpoint_tables = (self.decisions, self.responses, self.ejections, self.scrape_failures,
                                 self.models_fetch_failures)
        self._status_classes = {c: f"{c}xx" for c in range(1, 6)}
        self._fallback_children: dict[str, Counter] = {}
        self._stage_children = {s: self.stage_seconds.labels(stage=s) for s in STAGES}
        self._lookup_children = {k: self.lookups.labels(result=k) for k in ("match", "empty", "failed")}
        self._lookup_seen = 0
        self._lookup_matched = 0
        self._scraped_extra: dict[str, TableGauge] = {}  # metric name -> a registered scraped signal's gauge

    def _declare_decision_families(self, r: CollectorRegistry) -> None:
        """Each decision: its outcome, fallbacks, time by stage, prefix lookups."""
        self.decisions = TableCounter("loadaware_decisions", "Routing decisions by policy, endpoint and outcome "
                                 "(routed, fallback_load_only, no_endpoints, unknown_model, passthrough, rejected, "
                                 "shed, overloaded)",
                                 ["policy", "endpoint", "outcome"], registry=r)
        self.fallbacks = Counter("loadaware_fallbacks", "Decisions that lost a helper and fell back to the load "
                                 "term alone (or to Envoy's own fallback), by reason", ["reason"], registry=r)
        self.decision_seconds = Histogram("loadaware_decision_seconds", "Wall time of one routing decision",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.stage_seconds = Histogram("loadaware_decision_stage_seconds", "Wall time of each decision stage",
                                       ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.lookups = Counter("loadaware_prefix_lookups", "Prefix lookups by result (match, empty, failed, "
                               "salted: a cache_salt request the source cannot tell apart)", ["result"], registry=r)
        self.match_fraction = Gauge("loadaware_prefix_match_fraction",
                                    "Share of prefix lookups since start that credited some endpoint; "
                                    "near 0 under real traffic usually means a broken instance-id map",
                                    registry=r)
        self.unmapped_holders = Counter("loadaware_lmcache_unmapped_holders",
                                        "LMCache holders that mapped to no live endpoint", ["kind"], registry=r)

    def _declare_load_families(self, r: CollectorRegistry) -> None:
        """The engines' load as scraped and as counted here, the streams, the fleet."""
        self.inflight = TableGauge("loadaware_inflight_requests", "Requests this sidecar has in flight per endpoint",
                              ["endpoint"], registry=r)
        self.scraped_running = TableGauge("loadaware_engine_running", "Scraped vllm:num_requests_running",
                                     ["endpoint"], registry=r)
        self.scraped_waiting = TableGauge("loadaware_engine_waiting", "Scraped vllm:num_requests_waiting",
                                     ["endpoint"], registry=r)
        self.scraped_kv = TableGauge("loadaware_engine_kv_cache_usage", "Scraped vllm:kv_cache_usage_perc",
                                ["endpoint"], registry=r)
        self.scrape_failures = TableCounter("loadaware_scrape_failures", "Failed engine scrapes",
                                       ["endpoint", "reason"], registry=r)
        self.streams = Counter("loadaware_extproc_streams", "ext_proc streams by how they ended",
                               ["end"], registry=r)
        self.open_streams = Gauge("loadaware_extproc_open_streams", "ext_proc streams open now", registry=r)
        self.endpoints = Gauge("loadaware_endpoints", "Endpoints in the fleet", registry=r)
        self.fleet_kv_capacity = Gauge("loadaware_fleet_kv_capacity_tokens", "The fleet's GPU KV cache in tokens: "
                                       "each engine's vllm:cache_config_info num_gpu_blocks x block_size, summed",
                                       registry=r)

    def _declare_cache_families(self, r: CollectorRegistry) -> None:
        """The fleet's prefix working set, the prompts queued at engines, the tokenizer's caches."""
        self.working_set_tokens = Gauge("loadaware_prefix_working_set_tokens", "ESTIMATED: prompt-prefix tokens "
                                        "routed again while recent (the recurring working set that lane-spread "
                                        "compares with the fleet's KV capacity; sampled)", registry=r)
        self.working_set_new_heads = Gauge("loadaware_prefix_working_set_new_heads", "Prompt heads (first 16 "
                                           "tokens) seen only once lately: while above 0, lane-spread does not "
                                           "spread prefixes", registry=r)
        self.queued_blocks = Gauge("loadaware_prefix_queued_blocks", "Prompt blocks held by requests routed to "
                                   "an engine while it queued, not yet ended, summed over engines (lane-spread "
                                   "credits them to later requests for the same prefix there)", registry=r)
        self.queued_credited = Counter("loadaware_prefix_queued_credited_tokens", "Prompt tokens credited to "
                                       "queueing engines beyond the exact sources' match, because requests routed "
                                       "there hold them", registry=r)
        self.tokenizer_pieces = Gauge("loadaware_tokenizer_piece_cache",
                                      "Tokenizer piece cache: hits and misses since start, token ids and pieces "
                                      "held (--tokenizer-cache-tokens), and whether it is enabled (0: off, or "
                                      "an exactness self-check failed)", ["what"], registry=r)
        self.tokenizer_conversations = Gauge("loadaware_tokenizer_conversation_cache",
                                             "Tokenizer conversation cache (--conversation-cache-mb): hits, misses "
                                             "and tokens reused since start, entries and bytes held, and disabled (1 "
                                             "after an exactness check failed)", ["what"], registry=r)

    def _declare_request_families(self, r: CollectorRegistry) -> None:
        """The response path and the APIs: responses, generation APIs, stored responses."""
        self.responses = TableCounter("loadaware_responses", "Responses seen on the response path, by the endpoint "
                                 "that served and status class (2xx, 4xx, 5xx, ...)", ["endpoint", "code"],
                                 registry=r)
        self.api_requests = Counter("loadaware_api_requests", "Requests decided by their body, by generation API "
                                    "(completions, chat, responses, messages)", ["api"], registry=r)
        self.state_placements = Counter("loadaware_state_placements", "Requests naming a stored response, by how "
                                        "its holder was found (known, probed: sent to the holder; not_found, "
                                        "probe_failed, probe_busy, no_locator, error: routed as any request)", ["rule"],
                                        registry=r)
        self.state_learned = Counter("loadaware_state_learned", "Stored responses whose holder was learned from "
                                     "the response", registry=r)
        self.state_holders = Gauge("loadaware_state_holders", "Stored responses whose holder the sidecar knows "
                                   "(bounded by --state-max-entries)", registry=r)

    def _declare_endpoint_families(self, r: CollectorRegistry) -> None:
        """Per endpoint: failure-aware routing state, token signals, served models."""
        self.routing_state = TableGauge("loadaware_endpoint_routing_state", "1 for each endpoint's failure-aware "
                                   "routing state: healthy, ejected (out of rotation), probing (one request at a time)",
                                   ["endpoint", "state"], registry=r)
        self.ejections = TableCounter("loadaware_endpoint_ejections", "Endpoints taken out of rotation, by reason "
                                 "(http_5xx, timeout, passed_over, unreachable)", ["endpoint", "reason"],
                                 registry=r)
        # Token-level signals per endpoint (loadaware/load/signals.py), set when /metrics is read.
        self.signal_prefill = TableGauge("loadaware_endpoint_prefill_tokens", "Uncached prompt tokens routed to the "
                                    "endpoint whose first response chunk has not passed yet", ["endpoint"], registry=r)
        self.signal_uncached = TableGauge("loadaware_endpoint_uncached_tokens_in_flight", "Uncached prompt tokens of "
                                     "the requests in flight on the endpoint", ["endpoint"], registry=r)
        self.signal_decoding = TableGauge("loadaware_endpoint_decoding_requests", "Own requests on the endpoint past "
                                     "their first response chunk", ["endpoint"], registry=r)
        self.signal_ttft = TableGauge("loadaware_endpoint_observed_ttft_seconds", "Observed time to first response "
                                 "chunk on the endpoint (EWMA)", ["endpoint"], registry=r)
        self.signal_lane = TableGauge("loadaware_endpoint_prefill_lane_seconds", "Seconds until the prefill work "
                                 "routed to the endpoint is done, by the sidecar's prefill clock at the endpoint's "
                                 "learned speed", ["endpoint"], registry=r)
        self.endpoint_models = TableGauge("loadaware_endpoint_models", "1 for each model an endpoint serves (served "
                                     "names and LoRA adapters, from its /v1/models)", ["endpoint", "model"],
                                     registry=r)
        self.models_fetch_failures = TableCounter("loadaware_models_fetch_failures", "Failed /v1/models fetches (the "
                                             "last good list is kept until stale)", ["endpoint", "reason"],
                                             registry=r)

    # ---- hot path ----
    def decided(self, endpoint: str, outcome: str) -> None:
        key = (self.policy, endpoint, outcome)
        if self.decisions.add(key):
            self._series(endpoint, 0, key)

    def fallback(self, reason: str) -> None:
        child = self._fallback_children.get(reason)
        if child is None:
            child = self._fallback_children[reason] = self.fallbacks.labels(reason=reason)
        child.inc()

    def stage(self, stage: str, seconds: float) -> None:
        self._stage_children[stage].observe(seconds)

    def lookup_result(self, result: str) -> None:
        self._lookup_children[result].inc()
        if result != "failed":
            self._lookup_seen += 1
            self._lookup_matched += result == "match"

    def responded(self, endpoint: str, status: int) -> None:
        code = status // 100
        key = (endpoint, self._status_classes.get(code) or f"{code}xx")
        if self.responses.add(key):
            self._series(endpoint, 1, key)

    # ---- background ----
    def routing_state_changed(self, endpoint: str, state: str, reason: str) -> None:
        self.routing_state_now(endpoint, state)
        if state == "ejected" and self.ejections.add((endpoint, reason)):
            self._series(endpoint, 2, (endpoint, reason))

    def routing_state_now(self, endpoint: str, state: str) -> None:
        if self._state_shown.get(endpoint) == state:
            return
        for known in ROUTING_STATES:
            self.routing_state.labels(endpoint, known).set(1 if known == state else 0)
        self._state_shown[endpoint] = state

    def scraped(self, endpoint: str, running: float, waiting: float, kv_usage: float | None) -> None:
        self.scraped_running.labels(endpoint).set(running)
        self.scraped_waiting.labels(endpoint).set(waiting)
        if kv_usage is not None:
            self.scraped_kv.labels(endpoint).set(kv_usage)

    def scraped_signal(self, metric: str, help_text: str) -> TableGauge:
        """The per-endpoint gauge of a scraped signal beyond the core ones (load/scraped/), declared at first ask."""
        gauge = self._scraped_extra.get(metric)
        if gauge is None:
            gauge = self._scraped_extra[metric] = TableGauge(metric, help_text, ["endpoint"], registry=self.registry)
        return gauge

    def scrape_failure(self, endpoint: str, reason: str) -> None:
        if self.scrape_failures.add((endpoint, reason)):
            self._series(endpoint, 3, (endpoint, reason))

    def models_seen(self, endpoint: str, models: frozenset[str]) -> None:
        """The endpoint's model list now; labels of models it no longer lists are removed."""
        for gone in self._model_labels.get(endpoint, frozenset()) - models:
            self.endpoint_models.remove(endpoint, gone)
        for model in models:
            self.endpoint_models.labels(endpoint, model).set(1)
        self._model_labels[endpoint] = models

    def models_fetch_failure(self, endpoint: str, reason: str) -> None:
        if self.models_fetch_failures.add((endpoint, reason)):
            self._series(endpoint, 4, (endpoint, reason))

    def _series(self, endpoint: str, table: int, labels: tuple[str, ...]) -> None:
        """A new counter series of the endpoint's (`table`: its index in _endpoint_tables), to remove with it."""
        self._endpoint_series[endpoint] = (*self._endpoint_series.get(endpoint, ()), (table, labels))

    def forget_endpoint(self, endpoint: str) -> None:
        self.models_seen(endpoint, frozenset())
        self._model_labels.pop(endpoint, None)
        self._state_shown.pop(endpoint, None)
        self._inflight_shown.pop(endpoint, None)
        for gauge in (self.inflight, self.scraped_running, self.scraped_waiting, self.scraped_kv,
                      self.kv_connected, self.kv_lag, self.kv_index_blocks, self.approx_blocks, self.signal_prefill,
                      self.signal_uncached, self.signal_decoding, self.signal_ttft, self.signal_lane,
                      *self._scraped_extra.values()):
            try:
                gauge.remove(endpoint)
            except KeyError:
                pass
        for state in ROUTING_STATES:
            try:
                self.routing_state.remove(endpoint, state)
            except KeyError:
                pass
        for table, labels in self._endpoint_series.pop(endpoint, ()):
            with contextlib.suppress(KeyError):
                self._endpoint_tables[table].remove(*labels)
        for path in ("live", "replay"):  # the KV-event feeds' own series
            with contextlib.suppress(KeyError):
                self.kv_batches.remove(endpoint, path)
        with contextlib.suppress(KeyError):
            self.kv_gaps.remove(endpoint)

    def tokenizer_conversations_seen(self, counts: Mapping[str, int]) -> None:
        for what, value in counts.items():
            self.tokenizer_conversations.labels(what).set(value)

    def tokenizer_pieces_seen(self, hits: int, misses: int, enabled: bool, tokens: int, pieces: int) -> None:
        self.tokenizer_pieces.labels("hits").set(hits)
        self.tokenizer_pieces.labels("misses").set(misses)
        self.tokenizer_pieces.labels("tokens").set(tokens)
        self.tokenizer_pieces.labels("pieces").set(pieces)
        self.tokenizer_pieces.labels("enabled").set(1 if enabled else 0)

    def token_signals(self, endpoint: str, prefill: float, uncached: float, decoding: float,
                      ttft_s: float | None, lane_s: float = 0.0) -> None:
        self.token_signals_many(((endpoint, prefill, uncached, decoding, ttft_s, lane_s),))

    def token_signals_many(self, rows: Iterable[tuple[str, float, float, float, float | None, float]]) -> None:
        """(endpoint, prefill, uncached, decoding, ttft_s, lane_s) per endpoint, as `token_signals` sets them:
        the render thread sets these for every endpoint, so straight into the tables' dicts, five stores an
        endpoint with no series object made for each."""
        prefill, uncached, decoding, ttft, lane = (g.series() for g in (
            self.signal_prefill, self.signal_uncached, self.signal_decoding, self.signal_ttft, self.signal_lane))
        for endpoint, prefill_tokens, uncached_tokens, decoding_requests, ttft_s, lane_s in rows:
            key = (endpoint,)
            prefill[key] = float(prefill_tokens)
            uncached[key] = float(uncached_tokens)
            decoding[key] = float(decoding_requests)
            lane[key] = float(lane_s)
            if ttft_s is not None:
                ttft[key] = float(ttft_s)

    def render(self, inflight_snapshot: Callable[[], dict[str, int]], endpoints: tuple[str, ...]) -> bytes:
        """Exposition text; gauges that are cheap to compute on demand are set here, not per request."""
        counts = inflight_snapshot()
        shown = self._inflight_shown
        for endpoint in endpoints:
            count = counts.get(endpoint, 0)
            if shown.get(endpoint) != count:
                self.inflight.labels(endpoint).set(count)
                shown[endpoint] = count
        self.endpoints.set(len(endpoints))
        if self._lookup_seen:
            self.match_fraction.set(self._lookup_matched / self._lookup_seen)
        return self.registry.render()
