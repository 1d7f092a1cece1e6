"""What an SGLang pod's two doors answer alike, from its one deployment: its HTTP server
(`server/http/sglang/`) and its gRPC scheduler service (`server/sglang_servicer.py`,
smg-grpc-servicer's `SglangScheduler`). SGLang 0.5.23's words and numbers (docs/SGLANG.md):

- `check_sampling`: `SamplingParams.verify`, raising InvalidRequest in its words;
- `request_limits`: the scheduler's `max_req_len` (the context length or the KV pool, less
  one) and `max_req_input_len` (five less), as `TpModelWorker` computes them;
- `server_info`, `model_info`: the resolved server arguments doppelchip emulates and the
  model's facts, as `/server_info` and `/model_info` answer them (GetServerInfo and
  GetModelInfo carry the same);
- `load_snapshot`: one rank's `LoadSnapshot.to_dict(include)`, what `/v1/loads` and
  `GetLoads` report, with its windows between two polls (`Windows`);
- `probe`: SGLang's health check, one token from input_ids [0].
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from server.engine.errors import EngineError, InvalidRequest
from server.engine.interface import EngineRequest, FinishReason, PoolingParams, SamplingParams
from server.frontend import parallel
from server.frontend.deployment import DeploymentClient
from server.frontend.stream import StreamFailed
from server.ipc.deployment import DeploymentInfo
from server.stats.collector_sglang import Throughput, WindowRatio

SGLANG_VERSION = "0.5.23"  # the SGLang release whose server this mirrors (docs/SGLANG.md)
SECTIONS = ("core", "memory", "spec", "lora", "disagg", "queues", "all")
MAX_NEW_TOKENS = 128  # SamplingParams' default


def check_sampling(sp: dict[str, Any]) -> None:
    """`SamplingParams.verify`, in its words (InvalidRequest)."""
    def num(key: str, default: float) -> float:
        value = sp.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequest(f"{key} must be a number, got {value!r}.")
        return value

    temperature, top_p, min_p = num("temperature", 1.0), num("top_p", 1.0), num("min_p", 0.0)
    top_k = num("top_k", -1)
    if not (math.isfinite(temperature) and temperature >= 0):
        raise InvalidRequest(f"temperature must be a non-negative finite number, got "
                             f"{temperature}.")
    if not 0 < top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {top_p}.")
    if not 0 <= min_p <= 1:
        raise InvalidRequest(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1 and top_k != -1:
        raise InvalidRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    for key in ("frequency_penalty", "presence_penalty"):
        if not -2 <= num(key, 0.0) <= 2:
            raise InvalidRequest(f"{key} must be in [-2, 2], got {sp[key]}.")
    if not 0 <= num("repetition_penalty", 1.0) <= 2:
        raise InvalidRequest(f"repetition_penalty must be in [0, 2], got "
                             f"{sp['repetition_penalty']}.")
    max_new = sp.get("max_new_tokens", MAX_NEW_TOKENS)
    min_new = num("min_new_tokens", 0)
    if max_new is not None:
        if num("max_new_tokens", MAX_NEW_TOKENS) < 0:
            raise InvalidRequest(f"max_new_tokens must be at least 0, got {max_new}.")
        if not 0 <= min_new <= max_new:
            raise InvalidRequest(f"min_new_tokens must be in [0, max_new_tokens({max_new})], "
                                 f"got {min_new}.")
    elif min_new < 0:
        raise InvalidRequest(f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.")
    if int(num("n", 1)) < 1:
        raise InvalidRequest(f"n must be at least 1, got {sp.get('n')}.")


def request_limits(client: DeploymentClient) -> tuple[int, int]:
    """(`max_req_len`, `max_req_input_len`): min(context length, KV pool tokens) less one,
    and five less than that (SGLang's `TpModelWorker`)."""
    c = client.info.capacity
    max_req_len = min(c.max_model_len, c.kv_blocks_total * c.block_size) - 1
    return max_req_len, max_req_len - 5


def server_info(client: DeploymentClient, enable_metrics: bool) -> dict:
    info, c = client.info, client.info.capacity
    lim = client.limits
    return {
        "model_path": info.model_path or info.model, "tokenizer_path": info.model_path or
        info.model, "served_model_name": info.model_name, "tp_size": info.tensor_parallel,
        "pp_size": info.pipeline_parallel, "dp_size": info.data_parallel_size,
        "context_length": c.max_model_len, "mem_fraction_static": info.gpu_memory_utilisation,
        "max_running_requests": c.max_num_seqs, "page_size": c.block_size,
        "disable_radix_cache": not info.enable_prefix_caching,
        "kv_cache_dtype": info.cache_dtype, "schedule_policy": "fcfs" if not
        lim.priority_scheduling else "priority", "enable_metrics": enable_metrics,
        "device": "cuda", "chip": info.chip, "max_total_num_tokens": c.kv_blocks_total *
        c.block_size, "max_req_input_len": request_limits(client)[1], "status": "ready",
        **speculative_args(info),
        "internal_states": [{"world_size": info.tensor_parallel * info.pipeline_parallel,
                             "effective_max_running_requests_per_dp": c.max_num_seqs,
                             "last_gen_throughput": 0.0,
                             **({"avg_spec_accept_length": length}
                                if (length := accept_length(view)) is not None else {})}
                            for view in client.views],
        "version": SGLANG_VERSION, "frontend": "python",
        "kv_events_config": kv_events_config(info),
        "kv_events": kv_events_block(client),
    }


def kv_events_block(client: DeploymentClient) -> dict | None:
    """SGLang's `/server_info` `kv_events` (its `_build_kv_events_block`), which gateways read
    to subscribe: where rank 0 publishes (`endpoint_host`, `endpoint_port_base`; rank r on the
    base + r, which holds unless the configured port is 0 and there are several ranks), the
    topic, the page size the blocks are published at, and the publishing ranks; null when the
    pod publishes none."""
    ranks = [i for i in client.infos if i.kv_events_endpoint]
    if not ranks or not ranks[0].kv_events_endpoint.startswith("tcp://"):
        return None
    host, _, port = ranks[0].kv_events_endpoint[len("tcp://"):].rpartition(":")
    return {"publisher": "zmq", "endpoint_host": host, "endpoint_port_base": int(port),
            "topic": ranks[0].kv_events_topic, "block_size": client.info.capacity.block_size,
            "dp_size": len(ranks)}


def kv_events_config(info: DeploymentInfo) -> str | None:
    """SGLang's `kv_events_config` server argument (its JSON, or null without events), with the
    endpoints the pod bound (a port 0 resolved), where a router subscribes."""
    if not info.kv_events_endpoint:
        return None
    doc = {"publisher": "zmq", "endpoint": info.kv_events_endpoint, "topic": info.kv_events_topic}
    if info.kv_events_replay_endpoint:
        doc["replay_endpoint"] = info.kv_events_replay_endpoint
    return json.dumps(doc)


def model_info(client: DeploymentClient) -> dict:
    info = client.info
    return {"model_path": info.model_path or info.model, "served_model_name": info.model_name,
            "tokenizer_path": info.model_path or info.model,
            "is_generation": not client.limits.pooling_task,
            "preferred_sampling_params": None, "weight_version": "default",
            "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
            "disaggregation_mode": "null", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": None, "architectures": None}


def unknown_sections(include: set[str]) -> str | None:
    """SGLang's refusal of `include` sections it does not know (`/v1/loads`, GetLoads), or
    None when every one is known."""
    if include <= set(SECTIONS):
        return None
    return (f"Invalid include sections: {include - set(SECTIONS)}. Valid options: "
            f"{sorted(SECTIONS)}")


class Windows:
    """Each rank's load windows between two polls (as the sglang: gauges' between two
    scrapes): generated tokens per emulated second, prefix-cache hit rate. One per door."""

    def __init__(self) -> None:
        self.rates: dict[int, tuple[Throughput, WindowRatio, WindowRatio]] = {}

    def of(self, rank: int) -> tuple[Throughput, WindowRatio, WindowRatio]:
        """Its throughput, prefix-cache hit rate and speculative acceptance rate windows."""
        return self.rates.setdefault(rank, (Throughput(), WindowRatio(), WindowRatio()))


def load_snapshot(client: DeploymentClient, rank: int, windows: Windows, now: float,
                  include: set[str] | None) -> dict:
    """One rank's `LoadSnapshot.to_dict(include)`."""
    rate, hit_rate, acceptance = windows.of(rank)
    view = client.views[rank]
    values, _ = view.read()
    status = client.status([rank])
    c = status.capacity
    used = (c.kv_blocks_total - c.kv_blocks_free) * c.block_size
    total = c.kv_blocks_total * c.block_size
    queries = view.value(values, "vllm:prefix_cache_queries")
    hits = view.value(values, "vllm:prefix_cache_hits")
    cap = c.max_num_seqs  # SGLang's max_running_requests
    out: dict = {
        "timestamp": time.time(), "dp_rank": view.info.dp_rank,
        "num_running_reqs": status.num_running, "num_waiting_reqs": status.num_waiting,
        "num_waiting_uncached_tokens": 0, "num_used_tokens": used, "num_total_tokens": used,
        "num_active_tokens": used, "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": total, "max_running_requests": cap,
        "token_usage": used / total if total else 0.0,
        "gen_throughput": rate(client.generated_tokens([rank]), now),
        "cache_hit_rate": hit_rate(hits, queries),
        "utilization": status.num_running / cap if cap else 0.0,
        "total_prefill_uncached_tokens": int(queries - hits), "total_prefill_busy_us": 0,
        "decode_moments": None,
    }
    if include is None or "all" in include or "memory" in include:
        info = view.info
        out["memory"] = {"weight_gb": round(sum(info.weights_resident) / 1e9, 3),
                         "kv_cache_gb": round(total * info.kv_bytes_per_token / 1e9, 3),
                         "graph_gb": 0.0, "token_capacity": total}
    length = accept_length(view, values)
    if length is not None and (include is None or "all" in include or "spec" in include):
        # SGLang's: the mean accepted length since it started, the acceptance rate of its last
        # decode log (here: since the previous poll), once a verification step ran
        width = view.info.drafts_per_step  # SGLang's draft tokens - 1 per verification
        out["speculative"] = {"accept_length": length, "accept_rate": acceptance(
            view.value(values, "vllm:spec_decode_num_accepted_tokens"),
            view.value(values, "vllm:spec_decode_num_drafts") * width)}
    if include is None or "all" in include or "queues" in include:
        out["queues"] = {"waiting": status.num_waiting, "grammar": 0, "paused": 0,
                         "retracted": 0, "prealloc_ready": 0}
    return out


def speculative_args(info: DeploymentInfo) -> dict:
    """SGLang's resolved speculative server arguments (None without speculation): NEXTN
    resolves to EAGLE, and an MTP draft is the model itself; the draft steps, topk and draft
    tokens as resolved (doppelchip/sglang_spec.py)."""
    k = info.num_speculative_tokens
    draft = (info.model_path or info.model) if info.speculative_method == "mtp" \
        else info.speculative_model or None
    return {"speculative_algorithm": {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "EAGLE"}.get(
                info.speculative_method),
            "speculative_draft_model_path": draft if k else None,
            "speculative_draft_model_revision": "main" if k and draft else None,
            "speculative_num_steps": k or None,
            "speculative_eagle_topk": info.speculative_topk or None,
            "speculative_num_draft_tokens": info.drafts_per_step + 1 if k else None}


def accept_length(view, values=None) -> float | None:
    """A speculating rank's tokens per verification step since it started (accepted drafts +
    the bonus: SGLang's total accept tokens over forward passes); None before its first."""
    if not view.info.num_speculative_tokens:
        return None
    if values is None:
        values, _ = view.read()
    drafts = view.value(values, "vllm:spec_decode_num_drafts")
    if not drafts:
        return None
    return (view.value(values, "vllm:spec_decode_num_accepted_tokens") + drafts) / drafts


async def probe(client: DeploymentClient) -> bool:
    """SGLang's health check (and a TensorRT-LLM pod's `/health_generate`): one token from
    input_ids [0] (an embedding request on a pooling model); True once it produced its token.
    A refusal (a full queue, a drain) is False, as SGLang's check times out then. Not counted
    in the request metrics (`log_metrics=False`, as SGLang sends it); the scheduler's gauges
    see it run."""
    pooled = bool(client.limits.pooling_task)
    request = EngineRequest(f"HEALTH_CHECK_{time.monotonic_ns()}", prompt_token_ids=(0,),
                            sampling=SamplingParams(max_tokens=1, temperature=0.0),
                            pooling=PoolingParams(task=client.limits.pooling_task) if pooled
                            else None, log_metrics=False)
    try:
        (stream,) = await parallel.submit_all(client, [request])
    except EngineError:
        return False
    try:
        async for chunk in stream.outputs():
            if chunk.token_ids or (pooled and chunk.finish is not None
                                   and chunk.finish.reason is FinishReason.STOP):
                return True
    except StreamFailed:
        pass
    finally:
        client.abort(stream)  # (a no-op once finished)
    return False
