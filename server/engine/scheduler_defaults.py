"""A deployment's scheduler configuration: the engine's defaults on its chip (devices/catalog/
engines.toml `scheduler`), the model's traits, then the deployment's own options.

What the model decides (vLLM 0.33.0 `EngineArgs._set_default_chunked_prefill_and_prefix_caching
_args`, `ModelConfig.is_chunked_prefill_supported` / `is_prefix_caching_supported`): a model
that keeps no KV cache (an encoder, `ModelSpec.holds_kv`) has nothing to cache or to continue a
chunk from, and a causal pooling model pooled by MEAN or CLS (`--pooler-config`) needs every
token's state at once; for both, prefix caching and chunked prefill default to off, and without
chunking the step budget is raised to a whole prompt (`max(max_model_len, default)`) unless it
was given. Asked for anyway, vLLM enables them with a warning; so does doppelchip, except the
prefix cache of a model without a KV cache, which stays off (there are no blocks to keep).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from devices import Placement, catalog
from server.engine.scheduler_config import SchedulerConfig

if TYPE_CHECKING:
    from server.engine.options import EngineOptions

logger = logging.getLogger("doppelchip.engine")

UNSUPPORTED = ("This model does not officially support {}. Enabling this manually may cause "
               "the engine to crash or produce incorrect outputs.")  # vLLM's warning


def engine_defaults(engine: str, chip: str) -> tuple[str, int | None, int | None]:
    """(policy, max_num_seqs, max_num_batched_tokens) of `engine` on `chip`, from the catalogue."""
    eng, spec = catalog.get_engine(engine), catalog.get_chip(chip)
    return eng.scheduler.for_chip(spec.tier.capacity_bytes, spec.name)


def default_seqs(opts: EngineOptions, placement: Placement | None = None) -> int | None:
    """The engine's sequence cap for `opts` (None: the build limit); SGLang's comes from the KV
    pool of `placement`, its floor before placing or when the model keeps no KV cache
    (SchedulerDefaults.max_seqs)."""
    chip = catalog.get_chip(opts.chip)
    pool = context = None
    if placement is not None and placement.model.holds_kv:
        pool, context = placement.kv_tokens, opts.max_model_len or placement.model.max_context
    return catalog.get_engine(opts.engine).scheduler.max_seqs(
        chip.tier.capacity_bytes, chip.name, pool, context or 1)


def scheduler_config(opts: EngineOptions, placement: Placement) -> SchedulerConfig:
    policy, _, tokens = engine_defaults(opts.engine, opts.chip)
    engine, model = placement.engine, placement.model
    holds_kv = model.holds_kv
    # vLLM's is_prefix_caching_supported / is_chunked_prefill_supported (the same rule)
    supported = holds_kv and (not model.is_pooling
                              or opts.pooler().caches_and_chunks(model.pooling_type))
    max_model_len = placement.max_context
    max_num_seqs = opts.max_num_seqs or default_seqs(opts, placement) or placement.spec.max_batch
    active = opts.max_num_active_seqs
    if active is not None and active > max_num_seqs:  # vLLM's SchedulerConfig check
        raise ValueError(f"max_num_active_seqs ({active}) cannot be greater than max_num_seqs "
                         f"({max_num_seqs}).")
    budget = opts.max_num_batched_tokens or tokens
    chunked = opts.chunked_prefill
    if chunked is None:  # the engine chunks when it has a step budget; an encoder never
        chunked = budget is not None and supported
    elif chunked and not supported:
        logger.warning(UNSUPPORTED.format("chunked prefill"))
    if opts.max_num_batched_tokens is None:  # vLLM: whole prompts fit an unchunked step
        budget = max(budget or max_model_len, 1 if chunked else max_model_len)
    prefix = opts.prefix_cache if opts.prefix_cache is not None else (
        engine.prefix_cache != "off" and supported)
    if prefix and not supported:
        logger.warning(UNSUPPORTED.format("prefix caching"))
        prefix = prefix and holds_kv  # (an encoder has no KV blocks to keep)
    block_size = opts.block_size_on(placement.engine, placement.chip, placement.model.is_mla)
    blocks = placement.kv_blocks(block_size)
    if opts.kv_blocks is not None:
        if opts.kv_blocks > blocks:
            raise ValueError(f"kv_blocks={opts.kv_blocks} exceeds the {blocks} blocks the device "
                             "holds")
        blocks = opts.kv_blocks
    return SchedulerConfig(
        num_blocks=max(1, blocks) if holds_kv else 1,  # vLLM: a null block, no pool
        block_size=block_size,
        max_num_seqs=active or max_num_seqs,  # the admission cap; max_num_seqs sized memory
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        policy=opts.policy or policy,  # type: ignore[arg-type]
        enable_prefix_caching=prefix,
        kv_cache=holds_kv,
        kv_layout=opts.kv_layout or engine.kv_layout,  # type: ignore[arg-type]
        batching=opts.batching or engine.batching,  # type: ignore[arg-type]
        num_speculative_tokens=(placement.spec.speculative.drafts_per_step  # (a tree's width)
                                if placement.spec.speculative else 0),
        max_loras=opts.max_loras if opts.enable_lora else 0,  # --- LoRA (issue 13) ---
        long_prefill_token_threshold=opts.long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=opts.long_prefill_token_threshold_adaptive,
        max_num_inflight_kv_loads=opts.max_num_inflight_kv_loads,
        cache_aware_admission_window=opts.cache_aware_admission_window,
        cache_aware_admission_threshold=opts.cache_aware_admission_threshold,
    )
