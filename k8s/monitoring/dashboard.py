"""The Grafana dashboard (k8s/monitoring/loadaware-dashboard.json), built as code with grafana-foundation-sdk.

    python k8s/monitoring/dashboard.py          # regenerate (`make dashboard`)
    python k8s/monitoring/dashboard.py --check  # exit 1 when the checked-in JSON no longer matches (a test runs this)

Each panel carries, as its description, the question it answers when someone is paged at 3 a.m.; docs/operations.md
("The dashboard") repeats them. Variables: the data source, then namespace, pool and endpoint. `namespace` and
`pool` are target labels the scrape configuration adds (k8s/base/podmonitor.yaml and
k8s/monitoring/engines-podmonitor.yaml: `pool` from the pods' `loadaware.io/pool` label); `endpoint` is the
sidecar's own label (an engine's ip:port), which is also the `instance` Prometheus gives the engine's own
scrape, so the vLLM panels filter on it too.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos, VariableRefresh

TARGET = Path(__file__).resolve().parent / "loadaware-dashboard.json"
UID = "loadaware-sidecar"
RATE = "$__rate_interval"
SIDECAR = 'namespace=~"$namespace", pool=~"$pool"'
PER_ENDPOINT = SIDECAR + ', endpoint=~"$endpoint"'
ENGINE = 'namespace=~"$namespace", instance=~"$endpoint"'
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
LEGEND = (common_builders.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
          .placement(common.LegendPlacement.BOTTOM).show_legend(True))
TOOLTIP = common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    answers: str  # the 3 a.m. question, shown as the panel's description
    unit: str
    queries: tuple[Query, ...]


def q(expr: str, legend: str) -> Query:
    return Query(expr, legend)


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Routing decisions", (
        Panel("Decisions per second by outcome", "Is the sidecar deciding, and how? routed is normal; "
              "fallback_load_only means a helper failed; no_endpoints / unknown_model mean requests found no engine.",
              "reqps", (q(f"sum by (outcome) (rate(loadaware_decisions_total{{{SIDECAR}}}[{RATE}]))", "{{outcome}}"),)),
        Panel("Fallbacks per second by reason", "Which helper is failing (LMCache, tokenizer, KV events)? Each "
              "reason is a decision that routed on load alone.", "reqps",
              (q(f"sum by (reason) (rate(loadaware_fallbacks_total{{{SIDECAR}}}[{RATE}]))", "{{reason}}"),)),
        Panel("Share of requests per endpoint", "Is one engine drawing most of the traffic (a hot prefix, or an "
              "engine failing fast and looking idle)?", "percentunit",
              (q(f'sum by (endpoint) (rate(loadaware_decisions_total{{{PER_ENDPOINT}, endpoint!="none"}}[{RATE}])) '
                 f'/ ignoring (endpoint) group_left () '
                 f'sum(rate(loadaware_decisions_total{{{SIDECAR}, endpoint!="none"}}[{RATE}]))', "{{endpoint}}"),)),
        Panel("Decision latency", "Is the sidecar slow to decide (Envoy waits at most 1 s per message)? The stage "
              "lines say which part: parse, tokenize, lookup or score.", "s",
                (q(f"histogram_quantile(0.5, sum by (le) "
                 f"(rate(loadaware_decision_seconds_bucket{{{SIDECAR}}}[{RATE}])))", "p50"),
               q(f"histogram_quantile(0.99, sum by (le) "
                 f"(rate(loadaware_decision_seconds_bucket{{{SIDECAR}}}[{RATE}])))", "p99"),
               q(f"histogram_quantile(0.99, sum by (le, stage) "
                 f"(rate(loadaware_decision_stage_seconds_bucket{{{SIDECAR}}}[{RATE}])))", "p99 {{stage}}"))),
    )),
    ("Prefix cache", (
        Panel("Prefix-match fraction per source", "Do lookups credit any engine? Near 0 under real traffic usually "
              "means a broken LMCache instance-id map or a disconnected KV-event feed.", "percentunit",
              (q(f'sum by (source) (rate(loadaware_prefix_source_lookups_total{{{SIDECAR}, result="match"}}[{RATE}])) '
                 f'/ sum by (source) '
                 f'(rate(loadaware_prefix_source_lookups_total{{{SIDECAR}, result=~"match|empty"}}[{RATE}]))',
                 "{{source}}"),)),
        Panel("vLLM prefix-cache hit rate per endpoint", "Are the engines really reusing cached prefixes (the "
              "engines' own count, beside the sidecar's guesses)?", "percentunit",
              (q(f"sum by (instance) (rate(vllm:prefix_cache_hits_total{{{ENGINE}}}[{RATE}])) / "
                 f"sum by (instance) (rate(vllm:prefix_cache_queries_total{{{ENGINE}}}[{RATE}]))", "{{instance}}"),)),
    )),
    ("Load", (
        Panel("In flight per endpoint (this sidecar)", "How many of this gateway's requests does each engine hold "
              "now? Exact and without lag, but blind to other gateway replicas.", "short",
              (q(f"sum by (endpoint) (loadaware_inflight_requests{{{PER_ENDPOINT}}})", "{{endpoint}}"),)),
        Panel("Scraped running and waiting per endpoint", "What does each engine itself report (all gateways' "
              "traffic, up to a scrape interval old)? Waiting above 0 means the engine queues.", "short",
              (q(f"sum by (endpoint) (loadaware_engine_running{{{PER_ENDPOINT}}})", "{{endpoint}} running"),
               q(f"sum by (endpoint) (loadaware_engine_waiting{{{PER_ENDPOINT}}})", "{{endpoint}} waiting"))),
        Panel("vLLM KV-cache usage per endpoint", "Is an engine's KV cache full (it then preempts and evicts the "
              "prefixes the router counts on)?", "percentunit",
              (q(f"max by (instance) (vllm:kv_cache_usage_perc{{{ENGINE}}})", "{{instance}}"),)),
        Panel("vLLM time to first token (p90) per endpoint", "Are users waiting? TTFT is what prefix reuse and "
              "load balance are for.", "s",
              (q(f"histogram_quantile(0.9, sum by (le, instance) "
                 f"(rate(vllm:time_to_first_token_seconds_bucket{{{ENGINE}}}[{RATE}])))", "{{instance}}"),)),
        Panel("Pool averages (EPP names)", "The same load as a gateway's Inference Extension dashboards read it: "
              "mean queue, running requests and KV usage over the pool's engines.", "short",
              (q(f"max by (name) (inference_pool_average_queue_size{{{SIDECAR}}})", "{{name}} queue"),
               q(f"max by (name) (inference_pool_average_running_requests{{{SIDECAR}}})", "{{name}} running"),
               q(f"max by (name) (inference_pool_average_kv_cache_utilization{{{SIDECAR}}})", "{{name}} KV usage"))),
    )),
    ("Admission", (
        Panel("Requests held in admission by priority", "Is the pool saturated, and whose requests wait in the "
              "sidecar (with --admission on)? Held requests are released highest priority first as engines free "
              "batch slots.", "short",
              (q(f"sum by (priority) (loadaware_flow_control_queue_size{{{SIDECAR}}})", "priority {{priority}}"),
               q(f"max(loadaware_flow_control_pool_saturation{{{SIDECAR}}})", "saturated share of engines"),
               q(f"max(loadaware_flow_control_top_wait_floor{{{SIDECAR}}})",
                 "top priority's wait floor (over 0.05: unprotectable)"))),
        Panel("Admission outcomes per second", "Is work being shed? rejected_* and evicted answered 429; "
              "placed_* went to a saturated engine anyway (not sheddable).", "reqps",
              (q(f"sum by (outcome, priority) (rate(loadaware_flow_control_requests_total{{{SIDECAR}}}[{RATE}]))",
                 "{{outcome}} p{{priority}}"),)),
        Panel("Time held (p95) by priority", "How long do the released requests of each priority wait before "
              "an engine has room?", "s",
              (q(f"histogram_quantile(0.95, sum by (le, priority) (rate("
                 f'loadaware_flow_control_request_queue_duration_seconds_bucket{{{SIDECAR}, outcome="released"}}'
                 f"[{RATE}])))", "p{{priority}}"),)),
    )),
    ("Endpoint health", (
        Panel("Routing state per endpoint", "Which engines are out of rotation (ejected) or on probation "
              "(probing) after failing requests or unreachable scrapes?", "short",
              (q(f"max by (endpoint, state) (loadaware_endpoint_routing_state{{{PER_ENDPOINT}}}) == 1",
                 "{{endpoint}} {{state}}"),)),
        Panel("Ejections per endpoint and reason", "Why was an engine taken out: http_5xx, timeout, passed_over "
              "(Envoy retried past it) or unreachable?", "short",
              (q(f"sum by (endpoint, reason) (increase(loadaware_endpoint_ejections_total{{{PER_ENDPOINT}}}[{RATE}]))",
                 "{{endpoint}} {{reason}}"),)),
        Panel("Responses per second by endpoint and status", "Is an engine answering errors (5xx) while looking "
              "healthy otherwise?", "reqps",
              (q(f"sum by (endpoint, code) (rate(loadaware_responses_total{{{PER_ENDPOINT}}}[{RATE}]))",
                 "{{endpoint}} {{code}}"),)),
        Panel("Engine scrape failures", "Can the sidecar read each engine's load? Without it, load is its own "
              "in-flight count only.", "short",
              (q(f"sum by (endpoint, reason) (rate(loadaware_scrape_failures_total{{{PER_ENDPOINT}}}[{RATE}]))",
                 "{{endpoint}} {{reason}}"),)),
    )),
    ("KV-event feeds", (
        Panel("KV-event feed connected per endpoint", "Is each engine's KV-event publisher connected (1)? A 0 "
              "means that engine's prefix credit is gone until it reconnects.", "short",
              (q(f"max by (endpoint) (loadaware_kv_events_connected{{{PER_ENDPOINT}}})", "{{endpoint}}"),)),
        Panel("KV-event gaps, replays and batches", "Are events lost on the wire (gaps), and do replays recover "
              "them (result ok)?", "short",
              (q(f"sum by (endpoint) (increase(loadaware_kv_events_gaps_total{{{PER_ENDPOINT}}}[{RATE}]))",
                 "gaps {{endpoint}}"),
               q(f"sum by (reason, result) (increase(loadaware_kv_events_replays_total{{{SIDECAR}}}[{RATE}]))",
                 "replays {{reason}} {{result}}"),
               q(f"sum by (path) (rate(loadaware_kv_events_batches_total{{{PER_ENDPOINT}}}[{RATE}]))",
                 "batches/s {{path}}"))),
    )),
    ("ext_proc and Envoy", (
        Panel("ext_proc streams by how they ended", "Are streams failing in the sidecar (error)? eof is a normal "
              "end; so is most of cancelled: Envoy ends most streams of completed requests with a reset (and a "
              "client abort ends one cancelled too).", "reqps",
              (q(f"sum by (end) (rate(loadaware_extproc_streams_total{{{SIDECAR}}}[{RATE}]))", "{{end}}"),
               q(f"sum(loadaware_extproc_open_streams{{{SIDECAR}}})", "open now"))),
        Panel("Envoy: ext_proc failures and fail-open", "Is Envoy routing around the sidecar? Fail-open requests "
              "went by least-request, without the sidecar's choice.", "reqps",
              (q(f"sum(rate(envoy_http_ext_proc_streams_failed{{{SIDECAR}}}[{RATE}]))", "streams failed"),
               q(f"sum(rate(envoy_http_ext_proc_failure_mode_allowed{{{SIDECAR}}}[{RATE}]))", "fail-open"))),
    )),
)


def variables() -> list[dashboard.DatasourceVariable | dashboard.QueryVariable]:
    def query(name: str, label: str, expr: str) -> dashboard.QueryVariable:
        return (dashboard.QueryVariable(name).label(label).query(expr).datasource(DATASOURCE)
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True).multi(True).all_value(".*"))

    return [dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
            query("namespace", "Namespace", "label_values(loadaware_endpoints, namespace)"),
            query("pool", "Pool", 'label_values(loadaware_endpoints{namespace=~"$namespace"}, pool)'),
            query("endpoint", "Endpoint",
                  'label_values(loadaware_endpoint_routing_state{namespace=~"$namespace", pool=~"$pool"}, endpoint)')]


def build() -> dashboard.Dashboard:
    board = (dashboard.Dashboard("loadaware sidecar").uid(UID).tags(["loadaware", "llm", "envoy"])
             .description("The loadaware ext_proc router: its decisions, the engines' load and cache beside them, "
                          "and the health of every signal it routes on.")
             .refresh("30s").time("now-1h", "now").timezone("browser"))
    for variable in variables():
        board = board.with_variable(variable)
    y = 0
    panel_id = 1
    for row_title, panels in ROWS:
        board = board.with_row(dashboard.Row(row_title).id(panel_id).grid_pos(GridPos(h=1, w=24, x=0, y=y)))
        panel_id += 1
        y += 1
        for i, p in enumerate(panels):
            built = (timeseries.Panel().id(panel_id).title(p.title).description(p.answers).unit(p.unit)
                     .datasource(DATASOURCE).grid_pos(GridPos(h=8, w=12, x=12 * (i % 2), y=y + 8 * (i // 2)))
                     .legend(LEGEND).tooltip(TOOLTIP))
            for j, query in enumerate(p.queries):
                built = built.with_target(prometheus.Dataquery().ref_id(chr(ord("A") + j)).expr(query.expr)
                                          .legend_format(query.legend).datasource(DATASOURCE))
            board = board.with_panel(built)
            panel_id += 1
        y += 8 * ((len(panels) + 1) // 2)
    return board


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in JSON is stale")
    ns = parser.parse_args(argv)
    text = render()
    if ns.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(TARGET.parents[2])} is stale: run `make dashboard`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
