"""Pure translation of the sidecar's state into loadaware.v1 messages. No I/O, no clocks of its own."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format, struct_pb2

from loadaware.api.v1 import loadaware_pb2 as pb
from loadaware.fleet.discovery.catalog import DiscoveredEndpoint
from loadaware.fleet.health import HealthView
from loadaware.lifecycle import Decision
from loadaware.load.tracker import EngineStats
from loadaware.policies import Policy
from loadaware.policies.base import Candidate
from loadaware.policies.lane_spread import spreading
from loadaware.policies.loadaware import benefit, mean_load, relative_loads

ModelsFor = Callable[[str], list[str]]  # an endpoint's served models; [] when not known


def no_models(endpoint: str) -> list[str]:
    return []


HEALTH = {"HEALTHY": pb.HEALTHY, "DEGRADED": pb.DEGRADED, "UNHEALTHY": pb.UNHEALTHY, "DRAINING": pb.DRAINING}


def body_bytes(request: pb.ExplainRequest) -> bytes:
    """The request body a client would POST: the Struct as JSON (integral numbers back to ints: a Struct
    holds doubles, and token-id prompts and max_tokens are ints), else raw_body."""
    if request.HasField("body"):
        return json.dumps(_ints(json_format.MessageToDict(request.body))).encode()
    return request.raw_body.encode()


def _ints(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    return value


def scraped(stats: EngineStats | None, now: float, stale_s: float) -> pb.ScrapedLoad | None:
    if stats is None:
        return None
    age = max(0.0, now - stats.at)
    msg = pb.ScrapedLoad(running=stats.running, waiting=stats.waiting, age_seconds=round(age, 3),
                         fresh=age <= stale_s)
    if stats.kv_usage is not None:
        msg.kv_cache_usage = stats.kv_usage
    if stats.kv_capacity_tokens is not None:
        msg.kv_capacity_tokens = stats.kv_capacity_tokens
    if stats.scraped:  # the registered signals beyond the core ones (loadaware/load/scraped/)
        msg.signals.update(stats.scraped)
    return msg


def working_set_view(candidates: Sequence[Candidate], pool_size: int | None = None) -> pb.WorkingSetView:
    """The working-set values the decision's candidates carried (the same on each) and what they decided
    (`pool_size`: the pool's endpoints, when a large pool's decision scored only part of it)."""
    first = candidates[0]
    msg = pb.WorkingSetView(prefix_routes=first.prefix_routes, spreading=spreading(candidates, pool_size))
    if first.cache_demand is not None:
        msg.cache_demand = first.cache_demand
    return msg


def token_signals(c: Candidate, observed_ttft_s: float | None = None) -> pb.TokenSignals:
    """The candidate's token signals as the policy saw them (optional fields left out when unknown)."""
    msg = pb.TokenSignals(prefill_tokens=c.prefill_tokens, uncached_tokens_in_flight=c.uncached_tokens,
                          decode_batch=c.decode_batch)
    if c.kv_usage is not None:
        msg.kv_cache_usage = c.kv_usage
    if observed_ttft_s is not None:
        msg.observed_ttft_seconds = observed_ttft_s
    msg.prefill_lane_seconds = c.lane_wait_s
    for field, value in ((name, getattr(c, attr)) for attr, name in _LEARNED_TTFT):
        if value is not None:
            setattr(msg, field, value)
    return msg


# The prefill clock's learned TTFT model (what lane-spread prices with): Candidate attribute -> TokenSignals
# field (absent while not learned).
_LEARNED_TTFT = (("idle_ttft_base_s", "idle_ttft_base_seconds"),
                 ("idle_ttft_per_token_s", "idle_ttft_per_token_seconds"),
                 ("idle_ttft_per_running_s", "idle_ttft_per_running_seconds"))


def no_ttft(endpoint: str) -> float | None:
    return None


def no_signals(endpoint: str) -> pb.TokenSignals | None:
    return None


def routing_health(view: HealthView) -> pb.RoutingHealth:
    return pb.RoutingHealth(state=view.state, reason=view.reason, consecutive_failures=view.consecutive_failures,
                            ejections=view.ejections, ejected_for_seconds=view.ejected_for_s,
                            failures=view.failures, successes=view.successes)


def explanation(decision: Decision, policy: Policy, beta: float, kind: str,
                instance_for: Callable[[str], str | None], inflight: Callable[[str], int],
                stats_for: Callable[[str], pb.ScrapedLoad | None], routing_state: Callable[[str], str],
                excluded: Sequence[str] = (), model: str | None = None,
                models_for: ModelsFor = no_models,
                observed_ttft: Callable[[str], float | None] = no_ttft) -> pb.ExplainResponse:
    candidates = decision.candidates
    loads = [c.load for c in candidates]
    # A large pool's decision scores only the endpoints that could rank (routing/pruning.py): its mean load
    # is the pool's, carried on the decision.
    mean = decision.mean_load if decision.mean_load is not None else mean_load(loads)
    rel = relative_loads(loads, mean) if loads else []
    out = pb.ExplainResponse(
        outcome=decision.outcome, endpoint=decision.endpoint or "", reasons=list(decision.reasons),
        policy=policy.name, beta=beta if policy.name == "loadaware" else 0.0, formula=policy.formula, kind=kind,
        prompt_tokens=decision.prompt_tokens, mean_load=mean, model=model or "",
        stages_ms={k: round(v * 1e3, 3) for k, v in decision.stages.items()}, excluded=list(excluded),
        rule=decision.rule)
    for c, score, r in zip(candidates, decision.scores, rel):
        out.endpoints.append(pb.EndpointScore(
            endpoint=c.endpoint, lmcache_instance_id=instance_for(c.endpoint) or "",
            matched_tokens=c.matched_tokens, benefit=benefit(c.matched_tokens, decision.prompt_tokens),
            inflight=inflight(c.endpoint), scraped=stats_for(c.endpoint), load=c.load, relative_load=r,
            score=score, chosen=c.endpoint == decision.endpoint, routing_state=routing_state(c.endpoint),
            models=models_for(c.endpoint), signals=token_signals(c, observed_ttft(c.endpoint)),
            queued_tokens=int(c.queued_tokens)))
    if candidates and policy.needs.working_set:
        out.working_set.CopyFrom(working_set_view(candidates, decision.pool_size))
    return out


def endpoint_list(entries: Iterable[DiscoveredEndpoint], source: str, routable: Sequence[str],
                  loads: Sequence[float], instance_for: Callable[[str], str | None],
                  inflight: Callable[[str], int], stats_for: Callable[[str], pb.ScrapedLoad | None],
                  health_of: Callable[[str], HealthView], models_for: ModelsFor = no_models,
                  signals_for: Callable[[str], pb.TokenSignals | None] = no_signals) -> list[pb.Endpoint]:
    load_of = dict(zip(routable, loads))
    members = set(routable)
    out = []
    for e in entries:
        out.append(pb.Endpoint(
            endpoint=e.endpoint, source=source, health=HEALTH.get(e.health, pb.HEALTH_UNSPECIFIED),
            health_detail=e.detail, routable=e.endpoint in members, inflight=inflight(e.endpoint),
            load=load_of.get(e.endpoint, 0.0), last_scrape=stats_for(e.endpoint),
            lmcache_instance_id=instance_for(e.endpoint) or e.instance_id, pod=e.pod, zone=e.zone,
            routing_health=routing_health(health_of(e.endpoint)), models=models_for(e.endpoint),
            signals=signals_for(e.endpoint)))
    return out


def settings_list(described: Iterable[Mapping[str, Any]]) -> list[pb.Setting]:
    out = []
    for item in described:
        value = struct_pb2.Value()
        json_format.ParseDict(_jsonable(item["value"]), value)
        out.append(pb.Setting(name=item["name"], flag=item["flag"], env=item["env"], value=value,
                              origin=item["origin"]))
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)
