"""Frozen catalogue records: what a chip, a host part, an engine and a quantisation are.

Only data and derived properties live here; the numbers themselves (each with its public source)
are in ``devices/catalog/*.toml``. The model record is in ``devices/model.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devices.model import ModelSpec

__all__ = ["BatchTier", "ChipSpec", "EngineSpec", "KvSeqs", "MemoryRule", "ModelSpec",
           "QuantSpec", "SchedulerDefaults", "Tier"]

MIB = 2**20


@dataclass(frozen=True)
class Tier:
    """One memory tier of a chip: name ('hbm', 'vram', 'unified', 'sram', 'host_dram', 'ssd').

    ``capacity_bytes`` is what software sees: for device memory (HBM, VRAM) the total the
    driver reports (nvidia-smi / NVML, rocm-smi, Google's per-chip GiB), which is what an
    engine takes its memory share of; ``nominal_bytes`` is the vendor's marketing figure ("80
    GB"), shown beside it. They differ because vendors count HBM stacks in binary gigabytes
    and write them decimal: an H100 "80 GB" reports 81,559 MiB (85.5 GB). Tiers without a
    reported figure (SRAM, host DRAM, SSD, unified memory) have the two equal."""

    name: str
    capacity_bytes: float
    bandwidth_bps: float  # peak bytes per second
    nominal_bytes: float = 0.0  # the vendor's figure (0: as capacity_bytes)

    @property
    def nominal(self) -> float:
        """The vendor's figure for this tier."""
        return self.nominal_bytes or self.capacity_bytes


# A compute key the chip lacks falls back along this chain (then to the 16-bit rate): FP4
# weights on a chip without FP4 units are dequantised into 16-bit matmuls.
FALLBACK: dict[str, tuple[str, ...]] = {
    "fp4": ("fp4", "bf16", "fp16"), "fp8": ("fp8", "bf16", "fp16"),
    "int8_mma": ("int8_mma", "int8"), "fp16acc16": ("fp16acc16", "fp16", "bf16"),
    "int8": ("int8", "bf16", "fp16"),
}


@dataclass(frozen=True)
class ChipSpec:
    """A processor with its memory (a GPU, an Apple SoC, a TPU, an LPU, a wafer, or a host CPU).

    ``kind`` is 'accelerator', 'host' (CPU + DRAM) or 'storage' (an SSD); ``chip_class`` keys the
    engine efficiency factors (never the chip id). ``placement`` is how weights are laid out:
    'sharded' (device memory split over tp/ep ranks, KV from what is left), 'unified' (one pool
    shared with the CPU: the runtime may use ``usable_fraction``; no offload), 'sram' (weights in
    on-chip SRAM, pipelined over as many chips as they need) or 'host' (a CPU with DRAM).
    ``peak_flops`` maps a compute key ('bf16', 'fp8', 'fp4', 'int8', 'fp16acc16', 'int8_mma', ...)
    to dense peak FLOP/s; a key the chip lacks falls back along ``FALLBACK`` (an FP4 matmul on a
    chip without FP4 units runs at its 16-bit rate).

    Links: ``link_bw_bps`` is the scale-up fabric's bandwidth per chip, ONE direction, all links
    together (NVLink 4: 450 GB/s of 900); ``lane_bw_bps`` one link (a pipeline hop to the next
    chip uses one); ``collective_base_s`` + ``hop_latency_s`` per ring step is the latency model
    of a collective (NCCL's tuning model); ``domain_size`` chips share the fabric, beyond it
    traffic crosses ``scaleout_bw_bps`` / ``scaleout_latency_s`` (InfiniBand, Ethernet).
    ``launch_s``: host time to launch one kernel eagerly (engines without graphs pay it).
    """

    id: str
    name: str
    kind: str
    vendor: str
    chip_class: str
    arch: str
    placement: str
    tiers: tuple[Tier, ...]
    peak_flops: tuple[tuple[str, float], ...]
    link_bw_bps: float
    hop_latency_s: float
    host_link_bw_bps: float  # to the host (PCIe), one direction
    matmul_tile: int  # rows a matmul pass processes at once (TPU MXU); 1 = no padding
    usable_fraction: float  # share of the first tier the runtime may use (Metal working set)
    busy_watts: float
    idle_watts: float
    usd_per_hour: float
    price_basis: str
    lane_bw_bps: float = 0.0  # 0: same as link_bw_bps
    collective_base_s: float = 0.0
    domain_size: int = 1
    scaleout_bw_bps: float = 0.0
    scaleout_latency_s: float = 0.0
    launch_s: float = 0.0
    host: str | None = None  # host part id for a GPU box (llama.cpp offload)
    ssd: str | None = None
    os_reserve_bytes: float = 0.0  # host RAM the OS keeps (host parts only)
    # --- P/D (issue 13) ---
    scaleout: str | None = None  # the network link (catalog/links.toml) a KV transfer crosses
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def tier(self) -> Tier:
        """The chip's own (first, fastest) memory tier."""
        return self.tiers[0]

    @property
    def pipeline_hop_bw(self) -> float:
        """Bytes/s of the one link a pipeline stage sends its activations to the next over."""
        return self.lane_bw_bps or self.link_bw_bps

    def flops(self, key: str) -> float:
        """Dense peak FLOP/s for compute ``key``, falling back to the 16-bit rate if absent."""
        table = dict(self.peak_flops)
        for k in (*FALLBACK.get(key, (key,)), "bf16", "fp16", "fp32"):
            if k in table:
                return table[k]
        raise KeyError(key)

    def has_units(self, key: str) -> bool:
        """Whether the chip has matmul units for ``key`` (an FP4 rate of its own, say)."""
        return key in dict(self.peak_flops)


@dataclass(frozen=True)
class BatchTier:
    """Scheduler defaults an engine picks on GPUs with at least ``min_bytes`` of memory (None:
    keeps what a smaller tier gave), unless the chip's name contains one of ``except_names``
    (vLLM keeps A100s on its small defaults by device name: the engine's own rule, as data)."""

    min_bytes: float
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    except_names: tuple[str, ...] = ()

    def applies(self, capacity_bytes: float, chip_name: str) -> bool:
        name = chip_name.lower()
        return (capacity_bytes >= self.min_bytes
                and not any(n.lower() in name for n in self.except_names))


@dataclass(frozen=True)
class KvSeqs:
    """A sequence cap an engine derives from its KV pool at start-up: ``per_context`` × the
    pool's tokens / the context length, kept within [``low``, ``high``], and at most ``share``
    of the pool's tokens (SGLang's max_running_requests, ``resolve_max_num_reqs``). Why it
    exists: SGLang has no fixed default; a planner sees 2,048 on an H100, not vLLM's 1,024."""

    per_context: float
    low: int
    high: int
    share: float

    def seqs(self, kv_tokens: int, context_len: int) -> int:
        estimated = max(min(int(kv_tokens / context_len * self.per_context), self.high),
                        self.low)
        return max(1, min(estimated, int(kv_tokens * self.share)))


@dataclass(frozen=True)
class SchedulerDefaults:
    """What a user of an engine gets without flags: queue policy, sequence cap, token budget.

    ``max_num_seqs`` None: the deployment's build limit (TensorRT-LLM's max_batch);
    ``max_num_batched_tokens`` None: whole prompts, unchunked (the budget is max_model_len).
    ``by_memory``: ``BatchTier``s in ascending order of memory; the last one a chip reaches
    overrides what it gives. Engines pick bigger defaults on bigger GPUs: vLLM on ≥ 70 and
    ≥ 160 GiB, SGLang by its memory buckets. ``kv_seqs``: where ``max_num_seqs`` is None, the
    cap derived from the KV pool once placed (``KvSeqs``)."""

    policy: str = "fcfs"
    max_num_seqs: int | None = 256
    max_num_batched_tokens: int | None = 8192
    by_memory: tuple[BatchTier, ...] = ()
    kv_seqs: KvSeqs | None = None

    def for_chip(self, capacity_bytes: float,
                 chip_name: str = "") -> tuple[str, int | None, int | None]:
        """(policy, max_num_seqs, max_num_batched_tokens) on a chip of ``capacity_bytes``
        device memory named ``chip_name``."""
        seqs, tokens = self.max_num_seqs, self.max_num_batched_tokens
        for tier in self.by_memory:
            if tier.applies(capacity_bytes, chip_name):
                seqs = tier.max_num_seqs or seqs
                tokens = tier.max_num_batched_tokens or tokens
        return self.policy, seqs, tokens

    def max_seqs(self, capacity_bytes: float, chip_name: str = "", kv_tokens: int | None = None,
                 context_len: int = 1) -> int | None:
        """The sequence cap on this chip without flags: its tier's, else derived from the KV
        pool of ``kv_tokens`` (``kv_seqs``), its floor while the pool is not known yet; None:
        the deployment's build limit."""
        seqs = self.for_chip(capacity_bytes, chip_name)[1]
        if seqs is not None or self.kv_seqs is None:
            return seqs
        if kv_tokens is None:
            return self.kv_seqs.low
        return self.kv_seqs.seqs(kv_tokens, context_len)


@dataclass(frozen=True)
class MemoryRule:
    """How an engine sizes its KV cache at start-up: the share of each chip's memory it takes
    and what that share must hold. Why it exists: the engines differ, and a capacity planner
    comparing them on one chip sees it in the KV pool (engines.toml ``memory``; the fleet key
    ``gpu_memory_utilization`` overrides the share, as each engine's own knob does).

    ``rule``: 'total' — the share of capacity holds the weights, one step's peak activations
    and the KV cache (vLLM's gpu_memory_utilization); 'free' — the KV cache takes the share of
    what the weights and activations leave free (TensorRT-LLM's free_gpu_memory_fraction);
    'static' — the share holds the weights and the KV cache, and activations and captured
    graphs live in the rest (SGLang's mem_fraction_static). ``fraction`` None: the share is
    (capacity − reserve) / capacity, the reserve in MiB being ``reserve_mib`` + ``per_token_mib``
    × the step's token budget (at least ``min_tokens``) + ``per_rank_mib`` × tp × pp +
    ``per_seq_mib`` × the decode graphs' batch (the sequence cap, capped by the last
    ``graph_seqs`` tier ``(min_bytes, seqs)`` the chip reaches), and at least ``floor_mib`` on
    chips of more than ``floor_above_mib`` (SGLang's heuristic). ``sampler_bytes``: bytes per
    logit of the sampler warm-up the engine profiles at start-up over the sequence cap × the
    vocabulary (vLLM's ``_dummy_sampler_run``); the activations an engine sets aside are the
    larger of it and one step's hidden activations.
    """

    rule: str = "total"
    fraction: float | None = 0.9
    reserve_mib: float = 0.0
    per_token_mib: float = 0.0
    min_tokens: int = 0
    per_rank_mib: float = 0.0
    per_seq_mib: float = 0.0
    floor_mib: float = 0.0
    floor_above_mib: float = 0.0
    graph_seqs: tuple[tuple[float, int], ...] = ()
    sampler_bytes: float = 0.0

    def activations(self, step_bytes: float, seqs: int, vocab: int) -> float:
        """The profiled activation peak: one step's, or the sampler warm-up's if larger."""
        return max(step_bytes, self.sampler_bytes * seqs * vocab)

    def share(self, capacity_bytes: float, step_tokens: int, seqs: int, ranks: int) -> float:
        """The engine's default share of a chip of ``capacity_bytes``."""
        if self.fraction is not None:
            return self.fraction
        mib = capacity_bytes / MIB
        graphs = seqs
        for min_bytes, cap in self.graph_seqs:
            if capacity_bytes >= min_bytes:
                graphs = cap
        seqs = min(seqs, graphs)
        reserve = (self.reserve_mib + self.per_token_mib * max(step_tokens, self.min_tokens)
                   + self.per_rank_mib * ranks + self.per_seq_mib * seqs)
        if mib > self.floor_above_mib:
            reserve = max(reserve, self.floor_mib)
        return round((mib - reserve) / mib, 3)

    def kv_bytes(self, capacity_bytes: float, share: float, weights: float,
                 activations: float) -> float:
        """What the KV cache gets on one chip (may be ≤ 0: nothing fits)."""
        if self.rule == "free":
            return share * (capacity_bytes - weights - activations)
        if self.rule == "static":
            return share * capacity_bytes - weights
        return share * capacity_bytes - weights - activations


@dataclass(frozen=True)
class EngineSpec:
    """How a serving engine behaves on a chip (structure only; fitted factors are separate).

    ``compute_path`` per chip class (or 'default'): 'quant' runs a matmul in the weight format's
    compute dtype, anything else is a compute key. ``kernel_paths`` per chip arch (or class):
    which instructions the engine's kernels reach there, as a map from generic key to the
    chip's key (llama.cpp's MMQ kernels issue Ampere-style ``mma.sync`` on Hopper:
    {'int8': 'int8_mma'}). ``launch``: 'graph' (decode replayed as captured CUDA/HIP graphs),
    'eager' (each kernel launched by the host) or 'compiled' (one device program).
    ``shape_buckets`` (per-shape compilers): 'pow2' pads to power-of-two buckets (JetStream),
    'exact' compiles each new shape (MLX). ``offload``: may keep layers on the host CPU.
    """

    id: str
    name: str
    chip_classes: tuple[str, ...]  # the chip classes it runs on; anything else is refused
    kv_layout: str  # 'paged' | 'contiguous'
    batching: str  # 'continuous' | 'static'
    prefix_cache: str  # 'radix' | 'hash' | 'off'
    kernels_per_layer: float  # kernel launches (or program stages) per transformer layer
    compile: str  # 'none' | 'ahead_of_time' | 'per_shape' | 'static'
    compute_path: tuple[tuple[str, str], ...]
    scheduler: SchedulerDefaults
    jump_forward: bool
    deterministic: bool  # no jitter (Groq)
    offload: bool  # can keep layers on the host CPU (llama.cpp)
    compile_seconds: float  # per new shape / bucket (per_shape, static)
    borrow_from: tuple[str, ...]  # engines whose same-class factors stand in for missing ones
    quant_families: tuple[str, ...] = ("float",)  # weight formats it loads
    flop_eff_scale: float = 1.0  # stated assumption scaling a borrowed FLOP efficiency (MLX)
    kernel_paths: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    launch: str = "graph"
    shape_buckets: str = "exact"
    speculative_methods: tuple[str, ...] = ()  # vLLM speculative_config methods it runs
    expert_parallel: bool = False  # can shard MoE experts over ranks (ep > 1)
    dp_shares_experts: bool = False  # data-parallel ranks of a MoE model shard its experts
    #                                  over all ranks' chips and step together (else replicas)
    tp_divides_heads: bool = False  # TP shards attention heads: tp must divide their number
    uva_offload: bool = False  # --cpu-offload-gb: weights in pinned host memory, read every step
    memory: MemoryRule | None = None  # how it sizes its KV cache on sharded device memory
    kv_block_size: int = 16  # tokens per KV block (page) without a --block-size
    kv_block_size_by_vendor: tuple[tuple[str, int], ...] = ()  # a vendor build's first backend
    #   for standard attention without a KV connector, where its preference differs
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def path_for(self, chip_class: str) -> str:
        table = dict(self.compute_path)
        return table.get(chip_class, table.get("default", "bf16"))

    def block_size_on(self, chip: ChipSpec, mla: bool = False, connector: bool = False) -> int:
        """Tokens per KV block the engine picks on ``chip`` when the user names none. A
        vendor's preference belongs to its first backend for standard attention, which a
        model with latent attention (``mla``) or a pod with a KV ``connector`` does not run."""
        if mla or connector:
            return self.kv_block_size
        return dict(self.kv_block_size_by_vendor).get(chip.vendor, self.kv_block_size)

    def kernel_key(self, chip: ChipSpec, key: str) -> str:
        """The chip compute key this engine's kernels reach for generic ``key`` on ``chip``."""
        paths = dict(self.kernel_paths)
        table = dict(paths.get(chip.arch, paths.get(chip.chip_class, ())))
        return table.get(key, key)


@dataclass(frozen=True)
class QuantSpec:
    """A weight format: bytes per weight including block scales, KV bytes per element.

    ``scope``: which weights a checkpoint in this format stores at ``bytes_per_weight`` — 'all'
    (GGUF and MLX files quantise the embedding and head too), 'layers' (the decoder layers'
    linear weights; FP8, NVFP4, AWQ and GPTQ checkpoints leave the embedding and LM head in
    16 bit) or 'experts' (only the routed experts: gpt-oss's MXFP4).

    ``compute_dtype`` is what the matmul runs in where chip and engine allow it; on a chip
    without units for it the chip's ``flops`` fallback applies (FP4 weights dequantised to 16
    bit)."""

    id: str
    bytes_per_weight: float
    kv_bytes: float
    compute_dtype: str  # what the matmul can run on if the chip/engine allows ('int8', 'fp8', ...)
    family: str  # 'float' | 'gguf' | 'mlx' | 'scaled' | 'fp4' | 'int4'
    vllm_quantization: tuple[str, ...] = ()  # vLLM's --quantization names that load it
    scope: str = "all"  # which weights the format stores at bytes_per_weight (below)
    source: str = field(default="", compare=False)

    def layer_bytes(self, dense_params: float, expert_params: float) -> float:
        """Bytes of decoder-layer weights: routed experts always in the format; the rest
        (attention, dense MLPs, shared experts, routers) in it unless ``scope`` is 'experts'
        (gpt-oss's MXFP4 quantises only the experts; attention and routers stay bf16)."""
        dense = DENSE_BYTES if self.scope == "experts" else self.bytes_per_weight
        return dense_params * dense + expert_params * self.bytes_per_weight

    def edge_bytes(self, params: float) -> float:
        """Bytes of the embedding or the LM head: in the format only when ``scope`` is 'all'
        (GGUF, MLX); FP8, FP4 and int4 checkpoints keep both in 16 bit."""
        return params * (self.bytes_per_weight if self.scope == "all" else DENSE_BYTES)


DENSE_BYTES = 2.0  # a weight a format leaves unquantised is stored in bf16/fp16


@dataclass(frozen=True)
class CheckpointSpec:
    """A Hugging Face checkpoint (``repo``): the catalogue ``model`` with its architecture
    and the weight format ``quant`` it ships in. Why it exists: `vllm serve REPO` names a
    checkpoint, not a catalogue model (``checkpoints.toml``). ``kv_cache_dtype``: what vLLM
    resolves ``--kv-cache-dtype auto`` to for it — 'fp8' when it declares an FP8 KV-cache
    scheme, else 'auto': the model's 16-bit dtype, whatever the weights' format."""

    repo: str
    model: str
    quant: str
    kv_cache_dtype: str = "auto"
    source: str = field(default="", compare=False)
