"""The fleet file: one TOML document describing the server and its deployments.

```toml
[server]                      # all optional; CLI flags override
host = "127.0.0.1"
port = 50051
http_port = 8000              # OpenAI-compatible HTTP and /metrics (alias: metrics_port)
default_deployment = "vllm-h100"
time_scale = 1.0              # 0.01: emulated seconds pass 100x faster
drain_grace_s = 10.0
event_loop = "auto"           # auto | uvloop | asyncio (the front ends' event loop)
vllm_engine_deployment = ""   # what vllm.grpc.engine.VllmEngine fronts ("": default)
api_server_count = 0          # front-end processes sharing the ports (0: from the cores)
stream_interval = 1           # send every N tokens (a deployment's stream_interval wins)
engine_restart_backoff_s = 2.0  # a crashed engine process restarts after this (doubling)
# security and listener limits: docs/OPERATIONS.md (api_key, ssl_*, grpc_*, http_*, h11_*)

[[deployments]]
name = "vllm-h100"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
count = 1                     # optional; every field of server.engine.options.EngineOptions
```
Unknown keys are errors (a typo never silently falls back to a default).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from devices.errors import UnknownId
from server.engine.block_hash import hash_function
from server.engine.faults import check_options as check_fault_options
from server.engine.kv_events_config import KVEventsConfig, endpoint_problem
from server.engine.options import EngineOptions
from server.engine.spec_metrics import LEVELS as SPEC_METRICS_LEVELS
from server.server_config import ServerConfig, server_problem

DeploymentConfig = EngineOptions  # a [[deployments]] table is exactly the engine's options


class ConfigError(ValueError):
    """The fleet file is wrong; the message says where and what."""


ALIASES = {"metrics_port": "http_port"}  # [server] keys accepted under another name


def _server_table(table: dict[str, Any], where: str) -> dict[str, Any]:
    out = dict(table)
    for key in ("custom_histogram_buckets", "profiler_config"):  # a TOML table: the flag's JSON
        if isinstance(out.get(key), dict):
            out[key] = json.dumps(out[key])
    for alias, key in ALIASES.items():
        if alias in out:
            value = out.pop(alias)
            if key in out and out[key] != value:
                raise ConfigError(f"{where}: {alias} is an alias of {key}; they disagree "
                                  f"({value} vs {out[key]})")
            out[key] = value
    return out


@dataclass(frozen=True)
class FleetConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    deployments: tuple[DeploymentConfig, ...] = ()

    @property
    def default_deployment(self) -> str:
        return self.server.default_deployment or (
            self.deployments[0].name if self.deployments else ""
        )

    @property
    def vllm_engine_deployment(self) -> str:
        """The deployment this port's vllm.grpc.engine.VllmEngine service fronts."""
        return self.server.vllm_engine_deployment or self.default_deployment

    def with_server(self, **overrides: Any) -> FleetConfig:
        """A copy whose server section has the given (non-None) values replaced."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, server=dataclasses.replace(self.server, **changes))


_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


def _typed(value: Any, type_name: str, where: str) -> Any:
    type_name = type_name.removesuffix(" | None")  # TOML has no null: absent means None
    if type_name == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{where} must be a list of names, got {value!r}")
        return tuple(value)
    expected = _TYPES[type_name]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
        raise ConfigError(f"{where} must be a {type_name}, got {value!r}")
    return value


def _build(cls: type, table: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    missing = [n for n, f in known.items() if f.default is dataclasses.MISSING and n not in table]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {', '.join(missing)}")
    return cls(**{k: _typed(v, str(known[k].type), f"{where}: {k}") for k, v in table.items()})


_CHOICES = {
    "start": ("prebuilt", "cold"),
    "policy": ("fcfs", "priority", "lpm"),
    "kv_layout": ("paged", "contiguous"),
    "batching": ("continuous", "static"),
    "shape_policy": ("hold", "recompile"),
    "output_len_dist": ("geometric", "fixed"),
    "role": ("prefill", "decode", "both"),  # (virtual-time P/D pools: issue 16)
    "runner": ("auto", "generate", "pooling", "draft"),  # vLLM's (docs/EMBEDDINGS.md)
    "convert": ("auto", "none", "embed", "classify"),
    "per_request_spec_decode_metrics": SPEC_METRICS_LEVELS,  # vLLM's
}


# the EngineOptions fields that must be >= 1 when given (a fleet file's keys, and the
# deployment flags of simulate, load's sim: target and serve's pod mode: sim/simulation.py)
POSITIVE_KEYS = ("count", "tp", "pp", "max_model_len", "max_num_seqs", "max_num_active_seqs",
                 "max_num_batched_tokens",
                 "max_waiting", "block_size", "kv_blocks", "kv_cache_memory_bytes",
                 "max_grammar_bytes",
                 "stream_interval", "data_parallel_size", "data_parallel_size_local",
                 "max_grammar_depth",
                 "max_prompt_bytes", "max_stop_strings", "max_stop_bytes",
                 "max_loras", "max_lora_rank", "max_cpu_loras",  # (LoRA: issue 13)
                 "replicas",  # (virtual-time clusters: issue 16)
                 "max_num_inflight_kv_loads")  # (vLLM 0.34.0)
# ... and those that must be in (0, 1] when given (vLLM: Field(gt=0, le=1))
FRACTION_KEYS = ("gpu_memory_utilization", "kv_cache_metrics_sample")
# ... and those that must be >= 0 (vLLM: Field(ge=0))
NON_NEGATIVE_KEYS = ("cpu_offload_gb", "max_num_queued_reqs", "max_num_queued_tokens",
                     "long_prefill_token_threshold", "data_parallel_start_rank",
                     "cache_aware_admission_window")
# ... and those that must be in [0, 1] (vLLM: Field(ge=0, le=1))
UNIT_KEYS = ("cache_aware_admission_threshold",)


def range_problem(values: dict[str, Any]) -> tuple[str, str] | None:
    """The first EngineOptions field of `values` out of its range (the tables above), as
    (key, "must be … got …"); one check for a fleet file's keys and the deployment flags. A
    value of the wrong type is left to _build."""
    for key, v in values.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if key in POSITIVE_KEYS and isinstance(v, int) and v < 1:
            return key, f"must be >= 1, got {v}"
        if key in FRACTION_KEYS and not 0 < v <= 1:
            return key, f"must be in (0, 1], got {v}"
        if key in NON_NEGATIVE_KEYS and v < 0:
            return key, f"must be >= 0, got {v}"
        if key in UNIT_KEYS and not 0 <= v <= 1:
            return key, f"must be in [0, 1], got {v}"
        if key == "max_logprobs" and v < -1:  # vLLM's -1: the whole vocabulary
            return key, f"must be >= 0, or -1 for the whole vocabulary, got {v}"
    return None


def _deployment(table: dict[str, Any], where: str) -> EngineOptions:
    for key, choices in _CHOICES.items():
        if key in table and table[key] not in choices:
            raise ConfigError(f"{where}: {key} must be one of {', '.join(choices)}")
    if bad := range_problem(table):
        raise ConfigError(f"{where}: {bad[0]} {bad[1]}")
    # --- KV events (issue 13) ---
    for key in ("kv_events_port_offset", "kv_events_wire"):
        if key in table:
            raise ConfigError(f"{where}: {key} is set by the server, not the file")
    try:
        KVEventsConfig.parse(table.get("kv_events_config"))
        hash_function(table.get("prefix_caching_hash_algo", "sha256"))
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from e
    # --- end KV events ---
    auto = table.get("autoscaling")  # --- autoscale (issue 16): a table, checked by sim/ ---
    if isinstance(auto, dict):
        if not all(isinstance(v, (int, float, str)) and not isinstance(v, bool)
                   for v in auto.values()):
            raise ConfigError(f"{where}: autoscaling values must be numbers or names")
        table = {**table, "autoscaling": ",".join(f"{k}={v}" for k, v in auto.items())}
    opts = _build(EngineOptions, table, where)
    try:  # --- LoRA (issue 13): the LoRA options checked as vLLM checks them ---
        opts.check_vllm_config()
        opts.lora_config()
        opts.conversion()
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    except UnknownId:  # an unknown model: the deployment fails to place, saying so
        pass
    if problem := opts.rank_problem():
        raise ConfigError(f"{where}: {problem}")
    try:  # --- failure injection (issue 13) ---
        check_fault_options(opts)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    return opts


def parse_fleet(doc: dict[str, Any], source: str = "fleet file") -> FleetConfig:
    unknown = sorted(set(doc) - {"server", "deployments"})
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {', '.join(unknown)}")
    server = _build(ServerConfig, _server_table(doc.get("server", {}), f"{source} [server]"),
                    f"{source} [server]")
    if server.event_loop not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(f"{source} [server]: event_loop must be auto, uvloop or asyncio")
    for key in ("api_server_count", "stream_interval", "engine_restart_backoff_s"):
        low = 0 if key == "api_server_count" else (1 if key == "stream_interval" else 0.0)
        if getattr(server, key) < low:
            raise ConfigError(f"{source} [server]: {key} must be >= {low}")
    problem = server_problem(server)
    if problem:
        raise ConfigError(f"{source} [server]: {problem}")
    deployments = tuple(
        _deployment(d, f"{source} deployments[{i}]")
        for i, d in enumerate(doc.get("deployments", []))
    )
    names = [d.name for d in deployments]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{source}: duplicate deployment name(s) {', '.join(dupes)}")
    if not deployments:
        raise ConfigError(f"{source}: no deployments")
    fleet = FleetConfig(server, deployments)
    problem = kv_events_problem(fleet)
    if problem:
        raise ConfigError(f"{source} {problem}")
    if fleet.default_deployment not in names:
        raise ConfigError(
            f"{source}: default_deployment {fleet.default_deployment!r} is not one of {names}"
        )
    if fleet.vllm_engine_deployment not in names:
        raise ConfigError(
            f"{source}: vllm_engine_deployment {fleet.vllm_engine_deployment!r} is not one of "
            f"{names}"
        )
    return fleet


def kv_events_problem(fleet: FleetConfig) -> str:
    """The first deployment whose KV events cannot go where its config says from this
    server's host ("" when none): checked again once `serve`'s --host is applied."""
    for i, d in enumerate(fleet.deployments):
        problem = endpoint_problem(d.kv_events_config, fleet.server.host)
        cfg = KVEventsConfig.parse(d.kv_events_config)
        if not problem and fleet.server.http_api == "trtllm" and cfg.enabled and (
                cfg.replay_endpoint is None):
            problem = ("kv_events_config: a TensorRT-LLM pod's POST /kv_cache_events reads "
                       "the publisher's replay socket; give a replay_endpoint "
                       "(e.g. \"tcp://*:0\")")
        if problem:
            return f"deployments[{i}]: {problem}"
    return ""


def load_fleet(path: str | Path | None = None) -> FleetConfig:
    """The fleet at `path`, or the built-in default fleet."""
    import tomllib  # here: a run from command-line flags reads no TOML at all

    if path is None:
        from importlib import resources

        text = resources.files("server").joinpath("default_fleet.toml").read_text()
        return parse_fleet(tomllib.loads(text), "built-in default fleet")
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read fleet file {p}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from e
    return parse_fleet(doc, str(p))
