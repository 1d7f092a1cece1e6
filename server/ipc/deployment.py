"""`DeploymentInfo`: what one engine core tells the rest of the server about itself.

Why it exists: an engine core is built in a process of its own, and the front ends, the
metrics and the supervisor need its static facts (capacity, limits, tiers, the engine's
traits behind each protocol's answers) without building one. The engine sends it once, in
`EngineHello` (server/ipc/messages.py), after the core is built.
"""

from __future__ import annotations

import msgspec

from server.engine.intake import Limits
from server.engine.interface import Capacity


class DeploymentInfo(msgspec.Struct, frozen=True, array_like=True):
    """What a front end and the metrics need to know about one engine core, sent once by the
    engine after it is built (static for the life of the deployment)."""

    name: str
    rank: int
    model: str
    quant: str
    engine: str
    chip: str
    chip_count: int
    tensor_parallel: int
    pipeline_parallel: int
    placed: bool
    failure: str  # why it could not be placed ("" when placed)
    capacity: Capacity
    limits: Limits  # what a front end checks before sending a request
    enable_prefix_caching: bool
    gpu_memory_utilisation: float
    tiers: tuple[str, ...]  # memory tiers with metrics (weights, KV, bandwidth), fixed order
    weights_resident: tuple[float, ...]  # bytes per tier, in `tiers` order
    tier_peaks: tuple[float, ...]  # peak bandwidth per tier (0 where unused)
    peak_flops: float
    idle_watts: float
    usd_per_s: float
    kv_bytes_per_token: float = 0.0  # all chips together (vllm:estimated_write_bytes_per_gpu)
    num_speculative_tokens: int = 0  # speculative decoding: draft steps (0: off), and the
    drafts_per_step: int = 0  # drafts each verification checks (a tree's width; a chain's:
    speculative_topk: int = 0  # num_speculative_tokens), the draft's branches (1: a chain)
    speculative_method: str = ""  # its method (eagle, eagle3, mtp) and draft checkpoint, when
    speculative_model: str = ""  # given (an SGLang pod's /server_info names them)
    fault_tolerance: bool = False  # vLLM 0.34.0's --enable-fault-tolerance (its routes)
    served_model_names: tuple[str, ...] = ()  # what clients may send as `model`
    model_path: str = ""  # what vLLM's --model named, /v1/models' `root` ("": `model`)
    # --- KV events (issue 13) --- where this rank publishes ("" when it does not)
    kv_events_endpoint: str = ""
    kv_events_replay_endpoint: str = ""
    kv_events_topic: str = ""
    # --- LoRA (issue 13) ---
    max_loras: int = 0  # --enable-lora: adapters one step may run (0: LoRA off)
    faults: bool = False  # failure injection configured (issue 13): its metrics are exported
    # --- vLLM's observability flags: the engine's histograms (server/stats/buckets.py) ---
    kv_cache_metrics: bool = False  # --kv-cache-metrics: the KV residency histograms
    histogram_buckets: tuple[tuple[str, tuple[float, ...]], ...] = ()  # the server's
    #                                   --custom-histogram-buckets, (family, bounds) pairs
    cache_dtype: str = "auto"  # vLLM's resolved --kv-cache-dtype (cache_config_info's label)
    data_parallel_size: int = 1  # the ranks of the deployment's group, here or not (vLLM's)
    kv_offload_blocks: int = 0  # the CPU offloading tier's blocks (0: no tier; kv_offload.py)
    kv_offload_bytes: int = 0  # its size in bytes, chunk padding included
    kv_consumer: bool = False  # loads KV through a connector (vllm:num_requests_kv_fetch_...)
    nixl: bool = False  # has vLLM's NIXL connector, either role (its vllm:nixl_* metrics)
    dp_rank: int = 0  # the data-parallel rank clients see (vLLM's `engine` label, its KV
    #                   events' data_parallel_rank): data_parallel_start_rank + `rank`, the
    #                   index of this engine core among the server's
    chat_template: str = ""  # --chat-template's text: a cross-encoder's pair prompt (docs/
    #                          EMBEDDINGS.md; server/engine/score_template.py)
    max_num_batched_tokens: int = 0  # the scheduler's token budget per step (trtllm_ metrics)
    kv_events_wire: str = "vllm"  # how its KV events are encoded (server/kv_events/sglang_wire)

    @property
    def model_name(self) -> str:
        """vLLM's `model_name` label and the name /v1/models lists first: the first served
        name, else the catalogue model id."""
        return self.served_model_names[0] if self.served_model_names else self.model
