from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Health(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_UNSPECIFIED: _ClassVar[Health]
    HEALTHY: _ClassVar[Health]
    DEGRADED: _ClassVar[Health]
    UNHEALTHY: _ClassVar[Health]
    DRAINING: _ClassVar[Health]
HEALTH_UNSPECIFIED: Health
HEALTHY: Health
DEGRADED: Health
UNHEALTHY: Health
DRAINING: Health

class ExplainRequest(_message.Message):
    __slots__ = ("path", "body", "raw_body", "objective")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    RAW_BODY_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    path: str
    body: _struct_pb2.Struct
    raw_body: str
    objective: str
    def __init__(self, path: _Optional[str] = ..., body: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., raw_body: _Optional[str] = ..., objective: _Optional[str] = ...) -> None: ...

class AdmissionView(_message.Message):
    __slots__ = ("enabled", "priority", "sheddable", "would_hold", "held_ahead", "held", "pool_saturation")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SHEDDABLE_FIELD_NUMBER: _ClassVar[int]
    WOULD_HOLD_FIELD_NUMBER: _ClassVar[int]
    HELD_AHEAD_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    POOL_SATURATION_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    priority: int
    sheddable: bool
    would_hold: bool
    held_ahead: int
    held: int
    pool_saturation: float
    def __init__(self, enabled: _Optional[bool] = ..., priority: _Optional[int] = ..., sheddable: _Optional[bool] = ..., would_hold: _Optional[bool] = ..., held_ahead: _Optional[int] = ..., held: _Optional[int] = ..., pool_saturation: _Optional[float] = ...) -> None: ...

class ScrapedLoad(_message.Message):
    __slots__ = ("running", "waiting", "kv_cache_usage", "age_seconds", "fresh", "kv_capacity_tokens", "signals")
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FRESH_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    running: float
    waiting: float
    kv_cache_usage: float
    age_seconds: float
    fresh: bool
    kv_capacity_tokens: float
    signals: _containers.ScalarMap[str, float]
    def __init__(self, running: _Optional[float] = ..., waiting: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., age_seconds: _Optional[float] = ..., fresh: _Optional[bool] = ..., kv_capacity_tokens: _Optional[float] = ..., signals: _Optional[_Mapping[str, float]] = ...) -> None: ...

class WorkingSetView(_message.Message):
    __slots__ = ("cache_demand", "prefix_routes", "spreading")
    CACHE_DEMAND_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ROUTES_FIELD_NUMBER: _ClassVar[int]
    SPREADING_FIELD_NUMBER: _ClassVar[int]
    cache_demand: float
    prefix_routes: float
    spreading: bool
    def __init__(self, cache_demand: _Optional[float] = ..., prefix_routes: _Optional[float] = ..., spreading: _Optional[bool] = ...) -> None: ...

class TokenSignals(_message.Message):
    __slots__ = ("prefill_tokens", "uncached_tokens_in_flight", "decode_batch", "kv_cache_usage", "observed_ttft_seconds", "prefill_lane_seconds", "idle_ttft_base_seconds", "idle_ttft_per_token_seconds", "idle_ttft_per_running_seconds")
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNCACHED_TOKENS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DECODE_BATCH_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_LANE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTFT_BASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTFT_PER_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTFT_PER_RUNNING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    prefill_tokens: float
    uncached_tokens_in_flight: float
    decode_batch: float
    kv_cache_usage: float
    observed_ttft_seconds: float
    prefill_lane_seconds: float
    idle_ttft_base_seconds: float
    idle_ttft_per_token_seconds: float
    idle_ttft_per_running_seconds: float
    def __init__(self, prefill_tokens: _Optional[float] = ..., uncached_tokens_in_flight: _Optional[float] = ..., decode_batch: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., observed_ttft_seconds: _Optional[float] = ..., prefill_lane_seconds: _Optional[float] = ..., idle_ttft_base_seconds: _Optional[float] = ..., idle_ttft_per_token_seconds: _Optional[float] = ..., idle_ttft_per_running_seconds: _Optional[float] = ...) -> None: ...

class EndpointScore(_message.Message):
    __slots__ = ("endpoint", "lmcache_instance_id", "matched_tokens", "benefit", "inflight", "scraped", "load", "relative_load", "score", "chosen", "models", "routing_state", "signals", "queued_tokens")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LMCACHE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BENEFIT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    SCRAPED_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_LOAD_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_STATE_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    lmcache_instance_id: str
    matched_tokens: int
    benefit: float
    inflight: int
    scraped: ScrapedLoad
    load: float
    relative_load: float
    score: float
    chosen: bool
    models: _containers.RepeatedScalarFieldContainer[str]
    routing_state: str
    signals: TokenSignals
    queued_tokens: int
    def __init__(self, endpoint: _Optional[str] = ..., lmcache_instance_id: _Optional[str] = ..., matched_tokens: _Optional[int] = ..., benefit: _Optional[float] = ..., inflight: _Optional[int] = ..., scraped: _Optional[_Union[ScrapedLoad, _Mapping]] = ..., load: _Optional[float] = ..., relative_load: _Optional[float] = ..., score: _Optional[float] = ..., chosen: _Optional[bool] = ..., models: _Optional[_Iterable[str]] = ..., routing_state: _Optional[str] = ..., signals: _Optional[_Union[TokenSignals, _Mapping]] = ..., queued_tokens: _Optional[int] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("outcome", "endpoint", "reasons", "policy", "beta", "formula", "kind", "prompt_tokens", "mean_load", "endpoints", "stages_ms", "message", "model", "excluded", "working_set", "admission", "rule")
    class StagesMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    FORMULA_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_LOAD_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    STAGES_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    WORKING_SET_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    endpoint: str
    reasons: _containers.RepeatedScalarFieldContainer[str]
    policy: str
    beta: float
    formula: str
    kind: str
    prompt_tokens: int
    mean_load: float
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointScore]
    stages_ms: _containers.ScalarMap[str, float]
    message: str
    model: str
    excluded: _containers.RepeatedScalarFieldContainer[str]
    working_set: WorkingSetView
    admission: AdmissionView
    rule: str
    def __init__(self, outcome: _Optional[str] = ..., endpoint: _Optional[str] = ..., reasons: _Optional[_Iterable[str]] = ..., policy: _Optional[str] = ..., beta: _Optional[float] = ..., formula: _Optional[str] = ..., kind: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., mean_load: _Optional[float] = ..., endpoints: _Optional[_Iterable[_Union[EndpointScore, _Mapping]]] = ..., stages_ms: _Optional[_Mapping[str, float]] = ..., message: _Optional[str] = ..., model: _Optional[str] = ..., excluded: _Optional[_Iterable[str]] = ..., working_set: _Optional[_Union[WorkingSetView, _Mapping]] = ..., admission: _Optional[_Union[AdmissionView, _Mapping]] = ..., rule: _Optional[str] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("endpoint", "source", "health", "health_detail", "routable", "inflight", "load", "last_scrape", "lmcache_instance_id", "pod", "zone", "models", "routing_health", "signals")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    HEALTH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    ROUTABLE_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LAST_SCRAPE_FIELD_NUMBER: _ClassVar[int]
    LMCACHE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_HEALTH_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    source: str
    health: Health
    health_detail: str
    routable: bool
    inflight: int
    load: float
    last_scrape: ScrapedLoad
    lmcache_instance_id: str
    pod: str
    zone: str
    models: _containers.RepeatedScalarFieldContainer[str]
    routing_health: RoutingHealth
    signals: TokenSignals
    def __init__(self, endpoint: _Optional[str] = ..., source: _Optional[str] = ..., health: _Optional[_Union[Health, str]] = ..., health_detail: _Optional[str] = ..., routable: _Optional[bool] = ..., inflight: _Optional[int] = ..., load: _Optional[float] = ..., last_scrape: _Optional[_Union[ScrapedLoad, _Mapping]] = ..., lmcache_instance_id: _Optional[str] = ..., pod: _Optional[str] = ..., zone: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., routing_health: _Optional[_Union[RoutingHealth, _Mapping]] = ..., signals: _Optional[_Union[TokenSignals, _Mapping]] = ...) -> None: ...

class RoutingHealth(_message.Message):
    __slots__ = ("state", "reason", "consecutive_failures", "ejections", "ejected_for_seconds", "failures", "successes")
    class FailuresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    EJECTIONS_FIELD_NUMBER: _ClassVar[int]
    EJECTED_FOR_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    state: str
    reason: str
    consecutive_failures: int
    ejections: int
    ejected_for_seconds: float
    failures: _containers.ScalarMap[str, int]
    successes: int
    def __init__(self, state: _Optional[str] = ..., reason: _Optional[str] = ..., consecutive_failures: _Optional[int] = ..., ejections: _Optional[int] = ..., ejected_for_seconds: _Optional[float] = ..., failures: _Optional[_Mapping[str, int]] = ..., successes: _Optional[int] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("endpoints", "discovery", "ready", "fleet_version")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    FLEET_VERSION_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[Endpoint]
    discovery: str
    ready: bool
    fleet_version: int
    def __init__(self, endpoints: _Optional[_Iterable[_Union[Endpoint, _Mapping]]] = ..., discovery: _Optional[str] = ..., ready: _Optional[bool] = ..., fleet_version: _Optional[int] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Setting(_message.Message):
    __slots__ = ("name", "flag", "env", "value", "origin")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    name: str
    flag: str
    env: str
    value: _struct_pb2.Value
    origin: str
    def __init__(self, name: _Optional[str] = ..., flag: _Optional[str] = ..., env: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., origin: _Optional[str] = ...) -> None: ...

class GetConfigResponse(_message.Message):
    __slots__ = ("settings",)
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.RepeatedCompositeFieldContainer[Setting]
    def __init__(self, settings: _Optional[_Iterable[_Union[Setting, _Mapping]]] = ...) -> None: ...
