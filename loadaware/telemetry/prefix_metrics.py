"""The prefix indexes' families: the KV-events index and the approximate index, and which sources are in use.

A group of Metrics (telemetry/metrics.py), which mixes it in: callers see one object.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from loadaware.telemetry.table_series import TableCounter, TableGauge


class PrefixIndexFamilies:
    def _declare_prefix_index_metrics(self, r: CollectorRegistry) -> None:
        """The KV-events index (exact, from the engines' own events) and the approximate index (from our
        own decisions). Every approximate figure says so in its name: it is a guess, never a fact."""
        self.prefix_source_info = Gauge("loadaware_prefix_source_info", "Prefix sources in use; exact=false "
                                        "marks a source that guesses from its own routing decisions",
                                        ["source", "exact"], registry=r)
        self.kv_events = Counter("loadaware_kv_events_received", "KV events received, by kind "
                                 "(block_stored, block_removed, all_blocks_cleared, skipped)", ["kind"], registry=r)
        self.kv_event_blocks = Counter("loadaware_kv_events_blocks", "Block hashes carried by KV events, by "
                                       "what they did to the index (stored, removed, cleared, orphan, evicted; "
                                       "uncredited_group: blocks of a sliding-window, mamba or other "
                                       "non-full-attention KV-cache group, not indexed)",
                                       ["op"], registry=r)
        self.kv_batches = TableCounter("loadaware_kv_events_batches", "KV-event batches applied, by endpoint and "
                                  "path (live, replay)", ["endpoint", "path"], registry=r)
        self.kv_gaps = TableCounter("loadaware_kv_events_gaps", "Sequence gaps seen on an engine's feed", ["endpoint"],
                               registry=r)
        self.kv_replays = Counter("loadaware_kv_events_replays", "Replay requests by reason (gap, join) and "
                                  "result (ok, partial, timeout, error)", ["reason", "result"], registry=r)
        self.kv_resets = Counter("loadaware_kv_events_index_resets", "Engine indexes dropped, by reason "
                                 "(all_blocks_cleared, sequence_reset, vanished, gap_unrecovered, removed)",
                                 ["reason"], registry=r)
        self.kv_decode_errors = Counter("loadaware_kv_events_decode_errors", "KV-event messages that could not "
                                        "be decoded", registry=r)
        self.kv_connected = TableGauge("loadaware_kv_events_connected", "1 while the engine's KV-event publisher is "
                                  "connected", ["endpoint"], registry=r)
        self.kv_lag = TableGauge("loadaware_kv_events_lag_seconds", "How old the engine's last live KV-event batch "
                                 "was when the sidecar applied it (its publish time to now; a growing lag is a "
                                 "backlog in the feed's queue)", ["endpoint"], registry=r)
        self.kv_index_blocks = TableGauge("loadaware_kv_index_blocks", "Blocks the KV-events index holds per engine",
                                     ["endpoint"], registry=r)
        self.kv_index_bytes = Gauge("loadaware_kv_index_bytes", "Estimated memory of the KV-events index",
                                    registry=r)
        self.kv_index_limit = Gauge("loadaware_kv_index_max_blocks", "Bound on the KV-events index, in blocks "
                                    "summed over engines", registry=r)
        self.approx_blocks = TableGauge("loadaware_approx_index_blocks", "APPROXIMATE: blocks the sidecar guesses each "
                                   "engine holds, from its own routing decisions", ["endpoint"], registry=r)
        self.approx_bytes = Gauge("loadaware_approx_index_bytes", "Estimated memory of the approximate index",
                                  registry=r)
        self.approx_evictions = Counter("loadaware_approx_index_evictions", "APPROXIMATE: guessed blocks "
                                        "forgotten, by reason (capacity = the engine's KV is full, decay = too "
                                        "old to trust, endpoint_removed)", ["reason"], registry=r)
        self.approx_credited = Counter("loadaware_approx_credited_tokens", "APPROXIMATE: prompt tokens the "
                                       "approximate index credited to the chosen engine; compare with the engines' "
                                       "vllm:prefix_cache_hits_total to see how good the guess is", registry=r)
