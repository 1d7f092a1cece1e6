"""The static description of one engine core (`DeploymentInfo`), computed once where the core
is built and sent to the supervisor and the front ends: what they need for admission checks,
`ListDeployments` and the metrics' labels and constants."""

from __future__ import annotations

from devices import Placement, catalog
from devices.model import ModelSpec
from server.engine import score_template
from server.engine.core import EngineCore
from server.engine.faults import has_faults
from server.engine.hf_overrides import matryoshka, use_sep_token
from server.engine.intake import Limits
from server.engine.interface import Capacity
from server.engine.kv_transfer import KvTransferConfig
from server.engine.options import EngineOptions
from server.engine.tokenizer import Tokenizer
from server.ipc.deployment import DeploymentInfo


def tier_peaks(p: Placement) -> dict[str, float]:
    """Peak bytes/s of each memory tier the placement uses, over all chips holding it."""
    chip = p.chip
    parts = [(chip, p.chips)]
    spec = p.spec
    host_id = spec.host or chip.host
    host = catalog.get_chip(host_id) if host_id else None
    if host is not None:
        parts.append((host, 1))
    ssd_id = spec.ssd or chip.ssd or (host.ssd if host else None) or "nvme-gen4"  # as offload.py
    parts.append((catalog.get_chip(ssd_id), 1))
    used = {t for t, _ in p.weight_bytes}
    for stage in p.plan.stages:
        for seg in stage.segments:
            used.add(seg.kv_tier)
            used.update(t for t, _ in seg.weight_bytes)
    peaks: dict[str, float] = {}
    for part, count in parts:
        for tier in part.tiers:
            if tier.name in used and tier.name not in peaks:
                peaks[tier.name] = tier.bandwidth_bps * count
    return peaks


def peak_flops(p: Placement) -> float:
    """Dense peak FLOP/s of the deployment's chips on the engine's compute path."""
    path = p.engine.path_for(p.chip.chip_class)
    dtype = p.quant.compute_dtype if path == "quant" else path
    return p.chip.flops(dtype) * p.chips


def limits_of(opts: EngineOptions, vocab_size: int, capacity: Capacity,
              policy: str = "fcfs", model: ModelSpec | None = None) -> Limits:
    """The deployment's admission limits (Limits), from its options, its KV pool, its
    scheduler's queue policy and the model it serves (a pooling model's task and vector)."""
    pooling = {}
    if model is not None and model.is_pooling:
        mrl, dims = matryoshka(opts.hf_overrides, model.matryoshka)
        pooler = opts.pooler()
        pooling = {"pooling_task": model.pooling_task, "embedding_size": model.embedding_size,
                   "matryoshka": mrl, "matryoshka_dimensions": dims,
                   "num_labels": model.num_labels,
                   "use_sep_token": use_sep_token(opts.hf_overrides, bool(opts.conversion().task)),
                   "default_use_activation": pooler.use_activation,
                   "default_dimensions": pooler.dimensions, "logit_mean": pooler.logit_mean,
                   "logit_sigma": pooler.logit_sigma,
                   "task_instructions": tuple(model.task_instructions.items())}
    return Limits(name=opts.name, vocab_size=vocab_size, max_model_len=capacity.max_model_len,
                  num_blocks=capacity.kv_blocks_total, block_size=capacity.block_size,
                  max_waiting=opts.max_waiting, max_grammar_bytes=opts.max_grammar_bytes,
                  max_grammar_depth=opts.max_grammar_depth,
                  max_prompt_bytes=opts.max_prompt_bytes,
                  max_stop_strings=opts.max_stop_strings, max_stop_bytes=opts.max_stop_bytes,
                  priority_scheduling=policy == "priority", max_logprobs=opts.max_logprobs,
                  holds_kv=model is None or model.holds_kv, **pooling)


def placed_info(opts: EngineOptions, rank: int, core: EngineCore,
                tokenizer: Tokenizer) -> DeploymentInfo:
    p, cfg = core.placement, core.scheduler.config
    peaks = tier_peaks(p)
    resident = dict(p.weight_bytes)
    tiers = tuple(sorted(set(peaks) | set(resident) | set(p.memory_bytes(0))))
    per_request = -(-cfg.max_model_len // cfg.block_size)
    capacity = Capacity(
        kv_blocks_total=cfg.num_blocks, kv_blocks_free=cfg.num_blocks,
        block_size=cfg.block_size, max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_concurrency=min(cfg.max_num_seqs, cfg.num_blocks // per_request) if cfg.kv_cache
        else cfg.max_num_seqs,  # (an encoder: no KV cache bounds it)
        max_waiting=opts.max_waiting,
    )
    return DeploymentInfo(
        name=opts.name, rank=rank, model=opts.model, quant=opts.quant, engine=opts.engine,
        chip=opts.chip, chip_count=p.chips, tensor_parallel=p.tp, pipeline_parallel=p.pp,
        placed=True, failure="", capacity=capacity,
        limits=limits_of(opts, tokenizer.vocab_size, capacity, cfg.policy, p.model),
        enable_prefix_caching=cfg.enable_prefix_caching,
        gpu_memory_utilisation=p.memory_share, tiers=tiers,
        weights_resident=tuple(resident.get(t, 0.0) for t in tiers),
        tier_peaks=tuple(peaks.get(t, 0.0) for t in tiers), peak_flops=peak_flops(p),
        idle_watts=core.idle_watts, usd_per_s=core.dollars_per_s,
        kv_bytes_per_token=p.kv_bytes_per_token,
        num_speculative_tokens=core.speculative.num_speculative_tokens
        if core.speculative else 0,
        drafts_per_step=core.speculative.drafts_per_step if core.speculative else 0,
        speculative_topk=core.speculative.eagle_topk if core.speculative else 0,
        speculative_method=core.speculative.method if core.speculative else "",
        speculative_model=(core.speculative.model or "") if core.speculative else "",
        served_model_names=opts.served_model_name, model_path=opts.model_path,
        max_loras=opts.max_loras if opts.enable_lora else 0,  # --- LoRA (issue 13) ---
        faults=has_faults(opts),
        kv_cache_metrics=opts.kv_cache_metrics, cache_dtype=opts.cache_dtype,
        fault_tolerance=opts.recovery_timeout_s() is not None,
        data_parallel_size=opts.data_parallel_size,
        dp_rank=opts.data_parallel_start_rank + rank,
        chat_template=score_template.load(opts.chat_template),
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        **connector_info(opts, core),
        **offload_info(core),
    )


def connector_info(opts: EngineOptions, core: EngineCore) -> dict[str, bool]:
    """Which connector metrics vLLM registers: `kv_consumer` (vLLM's `is_kv_consumer`: the
    pod loads KV through a connector, NIXL as kv_consumer or kv_both, or the CPU tier, which
    `--kv-offloading-size` configures as kv_both) and `nixl` (a NixlConnector, either role)."""
    transfer = KvTransferConfig.parse(opts.kv_transfer_config)
    return {"kv_consumer": core.scheduler.offload is not None or (
                transfer is not None and transfer.is_kv_consumer),
            "nixl": transfer is not None and transfer.nixl is not None}


def offload_info(core: EngineCore) -> dict[str, int]:
    """The CPU offloading tier's size for its metrics (vllm:kv_offload_config_info)."""
    tier = core.scheduler.offload
    if tier is None:
        return {}
    return {"kv_offload_blocks": tier.num_blocks,
            "kv_offload_bytes": tier.num_blocks * tier.padded_block_bytes}


def _block_size(opts: EngineOptions) -> int:
    """The block size asked for, else the engine's for the chip and model (16 where the
    catalogue knows one of them not)."""
    try:
        return opts.block_size_on(catalog.get_engine(opts.engine), catalog.get_chip(opts.chip),
                                  catalog.get_model(opts.model).is_mla)
    except KeyError:
        return opts.block_size or 16


def failed_info(opts: EngineOptions, rank: int, why: str, vocab_size: int) -> DeploymentInfo:
    """A deployment that could not be placed: describe what was asked for."""
    return DeploymentInfo(
        name=opts.name, rank=rank, model=opts.model, quant=opts.quant, engine=opts.engine,
        chip=opts.chip, chip_count=opts.count or 0, tensor_parallel=opts.tp or 0,
        pipeline_parallel=opts.pp or 0, placed=False, failure=why,
        capacity=(capacity := Capacity(0, 0, _block_size(opts), 0, 0, 0, opts.max_waiting)),
        limits=limits_of(opts, vocab_size, capacity),
        enable_prefix_caching=False, gpu_memory_utilisation=0.0, tiers=(),
        weights_resident=(), tier_peaks=(), peak_flops=0.0, idle_watts=0.0, usd_per_s=0.0,
        served_model_names=opts.served_model_name, model_path=opts.model_path,
        dp_rank=opts.data_parallel_start_rank + rank,
    )
