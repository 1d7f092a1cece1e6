"""The LlmArgs settings a `trtllm-serve` command line asks for: its flags merged with the YAML
file of `--config` (alias `--extra_llm_api_options`), as TensorRT-LLM merges them.

TensorRT-LLM (serve.py and `update_llm_args_with_extra_dict` in tensorrt_llm/llmapi/
llm_args.py, the releases docs/TRTLLM_SERVE.md names) reads the file with `yaml.safe_load`: an
empty file is no setting, a root that is not a mapping is its error ("Configuration file root
must be a mapping."); a top-level key replaces the field of that name, except that a flag
typed on the command line wins (TensorRT-LLM warns when the two differ), and
`kv_cache_config` is merged key by key into the one the flags built. Of the fields, those
doppelchip emulates are kept (DEFAULTS, KV_DEFAULTS: TensorRT-LLM's own defaults), among them
the two that turn on trtllm-serve's HTTP metrics (`return_perf_metrics`: /prometheus/metrics;
`enable_iter_perf_stats`: the iteration stats of /metrics) and `speculative_config` (kept as
given: trtllm_spec.py reads it); loading and logging fields change
nothing (SILENT); every other key is named in a warning.

Why a module of its own: merging and checking settings from two sources is apart from
translating them into a pod (cmd_trtllm.py).
"""

from __future__ import annotations

import argparse
from typing import Any

# TorchLlmArgs field defaults (BaseLlmArgs: max_batch_size 2048, max_num_tokens 8192,
# max_beam_width 1, max_seq_len None: the model's; enable_chunked_prefill False; dtype auto)
DEFAULTS: dict[str, Any] = {
    "backend": "pytorch", "dtype": "auto", "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1, "context_parallel_size": 1, "moe_expert_parallel_size": None,
    "max_batch_size": 2048, "max_num_tokens": 8192, "max_seq_len": None, "max_beam_width": 1,
    "enable_chunked_prefill": False, "enable_attention_dp": False,
    # trtllm-serve's HTTP metrics (cmd_trtllm: the pod's --enable-metrics serves both)
    "return_perf_metrics": False, "enable_iter_perf_stats": False}
# KvCacheConfig field defaults: 90% of the free memory, block reuse (prefix caching) on,
# the checkpoint's KV dtype, 32 tokens a block, no KV cache event buffer
KV_DEFAULTS: dict[str, Any] = {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True,
                               "dtype": "auto", "tokens_per_block": 32,
                               "event_buffer_max_size": 0}  # > 0: KV cache events kept
KV_FLAGS = {"free_gpu_memory_fraction": "free_gpu_memory_fraction", "kv_cache_dtype": "dtype"}
SILENT = frozenset({  # loading, logging, processes: nothing a client sees changes
    "trust_remote_code", "revision", "hf_revision", "tokenizer", "tokenizer_mode",
    "tokenizer_revision", "custom_tokenizer", "skip_tokenizer_init", "gpus_per_node",
    "load_format", "num_postprocess_workers", "postprocess_tokenizer_dir", "print_iter_log",
    "enable_iter_req_stats", "iter_stats_max_iterations", "request_stats_max_iterations",
    "otlp_traces_endpoint", "telemetry_config", "reasoning_parser",
    "fail_fast_on_attention_window_too_large", "num_serve_frontends"})
# silent in gRPC mode only (the router parses reasoning there); trtllm-serve's HTTP server
# splits reasoning_content off, which is not emulated: named in the warning
HTTP_UNEMULATED = frozenset({"reasoning_parser"})
POSITIVE = ("tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size",
            "max_batch_size", "max_num_tokens", "max_beam_width")
OPTIONAL_POSITIVE = ("moe_expert_parallel_size", "max_seq_len")
SWITCHES = ("enable_chunked_prefill", "enable_attention_dp", "return_perf_metrics",
            "enable_iter_perf_stats")


def read_yaml(path: str) -> dict[Any, Any]:
    """The mapping in `path` (an empty file: none); ValueError when it cannot be read, is not
    YAML or is not a mapping."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"--config {path}: cannot read it: {e.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"--config {path}: not YAML: {e}".splitlines()[0]) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ValueError(f"--config {path}: Configuration file root must be a mapping.")
    return doc


class Settings:
    """The merged fields (`fields`, `kv`), where each came from (`origin`: the flag, or the
    file and key, for error messages) and what the merge has to say (`warnings`)."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = dict(DEFAULTS)
        self.kv: dict[str, Any] = dict(KV_DEFAULTS)
        self.origin: dict[str, str] = {}
        self.warnings: list[str] = []
        self.speculative: Any = None  # the file's speculative_config (trtllm_spec.py reads it)

    def label(self, key: str) -> str:
        """How to name setting `key` ('kv_cache_config.X' for a KV one) in a message."""
        return self.origin.get(key, key)


def merge(args: argparse.Namespace) -> Settings:
    """The settings of a parsed `trtllm-serve` command line: flags over TensorRT-LLM's
    defaults, the `--config` file over both but under an explicit flag; checked (ValueError
    says what is wrong and where it came from)."""
    from doppelchip.trtllm_flags import BY_DEST

    s = Settings()
    explicit: set[str] = set()
    for key in DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            s.fields[key], s.origin[key] = value, "/".join(BY_DEST[key].flags)
            explicit.add(key)
    for dest, key in KV_FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            name = f"kv_cache_config.{key}"
            s.kv[key], s.origin[name] = value, "/".join(BY_DEST[dest].flags)
            explicit.add(name)
    path = args.extra_llm_api_options
    if path is not None:
        _merge_file(s, path, read_yaml(path), explicit, bool(args.grpc))
    _check(s)
    return s


def _merge_file(s: Settings, path: str, doc: dict[Any, Any], explicit: set[str],
                grpc: bool) -> None:
    """The file's keys over `s` (`grpc`: gRPC mode, where a few more keys have no effect)."""
    silent = SILENT if grpc else SILENT - HTTP_UNEMULATED
    unknown: list[str] = []
    overridden: list[str] = []

    def take(target: dict[str, Any], key: str, name: str, value: Any) -> None:
        if name in explicit:
            if value != target[key]:
                overridden.append(name)
            return
        target[key], s.origin[name] = value, f"--config {path}: {name}"

    for key, value in doc.items():
        if key == "kv_cache_config":
            if not isinstance(value, dict):
                raise ValueError(f"--config {path}: kv_cache_config must be a mapping")
            for sub, v in value.items():
                if sub in KV_DEFAULTS:
                    take(s.kv, sub, f"kv_cache_config.{sub}", v)
                else:
                    unknown.append(f"kv_cache_config.{sub}")
        elif key == "speculative_config":
            s.speculative, s.origin[key] = value, f"--config {path}: {key}"
        elif key == "disagg_cluster":
            said = ("Argument 'disagg_cluster_config' is not supported when running in gRPC "
                    "mode (TensorRT-LLM's words); " if grpc else "")
            raise ValueError(f"--config {path}: disagg_cluster: {said}disaggregated serving is "
                             "not emulated")
        elif key in DEFAULTS:
            take(s.fields, key, key, value)
        elif key not in silent:
            unknown.append(str(key))
    if overridden:  # TensorRT-LLM's own warning
        s.warnings.append(f"Explicit CLI flag(s) {sorted(overridden)} override the value(s) "
                          "set in the YAML config; CLI takes precedence.")
    if unknown:
        s.warnings.append(f"--config {path}: {', '.join(unknown)}: accepted but not emulated: "
                          f"{'it changes' if len(unknown) == 1 else 'they change'} nothing here")


def _check(s: Settings) -> None:
    """ValueError for a value TensorRT-LLM would not start with (or no pod could serve)."""
    f, kv = s.fields, s.kv
    for key in POSITIVE + OPTIONAL_POSITIVE:
        value = f[key]
        if (value is not None or key in POSITIVE) and not _positive_int(value):
            raise ValueError(f"{s.label(key)} must be a positive integer (got {value!r})")
    for key in SWITCHES:
        if not isinstance(f[key], bool):
            raise ValueError(f"{s.label(key)} must be true or false (got {f[key]!r})")
    if not isinstance(kv["enable_block_reuse"], bool):
        raise ValueError(f"{s.label('kv_cache_config.enable_block_reuse')} must be true or "
                         f"false (got {kv['enable_block_reuse']!r})")
    fraction = kv["free_gpu_memory_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) \
            or not 0 < fraction <= 1:
        raise ValueError(f"{s.label('kv_cache_config.free_gpu_memory_fraction')} must be a "
                         f"fraction in (0, 1] (got {fraction!r})")
    events = kv["event_buffer_max_size"]
    if isinstance(events, bool) or not isinstance(events, int) or events < 0:
        raise ValueError(f"{s.label('kv_cache_config.event_buffer_max_size')} must be a "
                         f"non-negative integer (got {events!r})")
    if not _positive_int(kv["tokens_per_block"]):
        raise ValueError(f"{s.label('kv_cache_config.tokens_per_block')} must be a positive "
                         f"integer (got {kv['tokens_per_block']!r})")
    for key, where in (("backend", f), ("dtype", f), ("dtype", kv)):
        if not isinstance(where[key], str):
            name = key if where is f else f"kv_cache_config.{key}"
            raise ValueError(f"{s.label(name)} must be a string (got {where[key]!r})")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
