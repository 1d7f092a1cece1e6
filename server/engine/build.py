"""From a deployment's options to a ready EngineCore: place it, size the KV pool, pick the
scheduler defaults of the engine being emulated.

Scheduler defaults per engine (what a user of that engine gets without flags; every one can be
overridden per deployment) live in ONE place, the engine's `scheduler` table in
`devices/catalog/engines.toml` (policy, max_num_seqs, max_num_batched_tokens, each with its
source); `devices.estimate` packs prefill with the same budget, so `estimate` and `simulate`
chunk a prompt the same way. No budget there means whole, unchunked prefills (JetStream); no
sequence cap means the build limit (TensorRT-LLM's max_batch).

`shape_policy` (engines with a static whole-program compile, i.e. Groq): `hold` compiles once
for the batch cap and pads smaller batches to it (no recompiles, padding costs compute);
`recompile` compiles for the batch actually scheduled, so varied traffic recompiles and the
pipeline idles meanwhile. The design notes ask for both to be measurable.

Prefix caching and the KV layout / batching come from the engine's catalogue entry
(`devices/catalog/engines.toml`): `prefix = "radix" | "hash"` turns the prefix cache on
("hash" is vLLM's block-hash cache, which our block-granular radix tree behaves like).
So does jump-forward decoding of structured output (`jump_forward`, SGLang's compressed-FSM
trick; on only for sglang), which `EngineOptions.jump_forward` overrides per deployment.
"""

from __future__ import annotations

import logging

from devices import make_compile_strategy, make_jitter, place
from server.engine import pooler_config, score_template
from server.engine.block_hash import BlockHasher, SglangBlockHasher
from server.engine.constraints import compiler_for
from server.engine.core import EngineCore
from server.engine.intake import QueueLimits
from server.engine.kv_events import KvEventLog
from server.engine.kv_events_config import KVEventsConfig
from server.engine.kv_metrics import KVCacheMetricsCollector
from server.engine.kv_offload import host_tier
from server.engine.kv_offload_config import OffloadConfig
from server.engine.kv_transfer import KvTransferConfig
from server.engine.lora import LoraRegistry
from server.engine.mock_model import MockModel, OutputLengths
from server.engine.options import EngineOptions
from server.engine.radix_cache import RadixCache
from server.engine.scheduler import Scheduler
from server.engine.scheduler_defaults import scheduler_config
from server.engine.tokenizer import Tokenizer, get_tokenizer

logger = logging.getLogger("doppelchip.engine")

def build_core(opts: EngineOptions, tokenizer: Tokenizer | None = None) -> EngineCore:
    """Place the deployment and assemble its core. Raises devices.DeviceError (with the
    reason) when it cannot be placed, ValueError when an option is out of range."""
    lora = opts.lora_config()  # checked before placing: a bad flag is a clear error
    opts.conversion()  # a bad --hf-overrides, --runner or --convert: a clear error first
    if advice := score_template.check(opts.model, opts.hf_overrides, opts.chat_template):
        logger.warning(advice)
    placement = place(opts.spec(), ranks=opts.data_parallel_size)  # one rank's view
    for warning in pooler_config.problems(opts.pooler_config, placement.model.pooling_task):
        logger.warning(warning)  # (a refusal raises ValueError)
    transfer = KvTransferConfig.parse(opts.kv_transfer_config)  # refuse a bad config
    offload = OffloadConfig.resolve(opts.kv_offloading_size, opts.kv_offloading_backend,
                                    transfer.kv_connector if transfer else None,
                                    transfer.offloading.extra if transfer and transfer.offloading
                                    else None)
    tok = tokenizer or get_tokenizer()
    config = scheduler_config(opts, placement)
    lengths = OutputLengths(opts.output_len_dist, opts.output_len_mean)  # type: ignore[arg-type]
    core = EngineCore(
        placement=placement,
        scheduler=Scheduler(config, eos_token_id=tok.eos_token_id),
        model=MockModel.from_tokenizer(tok, lengths, seed=opts.seed),
        compiler=make_compile_strategy(placement, hold=opts.shape_policy == "hold"),
        jitter=make_jitter(placement, sigma=opts.jitter, seed=opts.seed),
        jump_forward=(opts.jump_forward if opts.jump_forward is not None
                      else placement.engine.jump_forward),
        constraints=compiler_for(tok),
        speculative=placement.spec.speculative,
        lora=LoraRegistry(lora, opts.served_model_name or (opts.model,)) if lora.enabled
        else None,
    )
    core.startup_s = core.compiler.startup_seconds(opts.start == "cold")
    opts.check_vllm_config()
    core.spec_metrics_level = opts.per_request_spec_decode_metrics
    core.queue_limits = QueueLimits(opts.max_num_queued_reqs, opts.max_num_queued_tokens)
    # --- KV events (issue 13) ---
    events = KVEventsConfig.parse(opts.kv_events_config)
    hasher: BlockHasher | SglangBlockHasher = BlockHasher.from_env(
        opts.prefix_caching_hash_algo)  # also checks the algorithm
    if opts.kv_events_wire == "sglang":  # a pod imitating SGLang names blocks as SGLang
        hasher = SglangBlockHasher()
    if events.enabled:
        if not isinstance(core.scheduler.cache, RadixCache):
            raise ValueError("kv_events_config: KV events need the prefix cache on")
        log = KvEventLog(hasher, config.block_size)
        if core.lora is not None:  # an adapter's blocks hash under its name and path
            log.loras = core.lora.hash_keys
        core.scheduler.cache.attach_events(log)
    # --- end KV events ---
    core.scheduler.has_connector = transfer is not None  # (vLLM's connector counters)
    if offload is not None:
        core.scheduler.attach_offload(host_tier(offload, placement, config))
        if events.enabled:
            core.scheduler.offload.attach_events(log)
    if opts.kv_cache_metrics:  # vLLM's --kv-cache-metrics: the pool reports to it
        core.scheduler.pool.metrics = KVCacheMetricsCollector(
            opts.kv_cache_metrics_sample, evictions=config.enable_prefix_caching, seed=opts.seed)
    return core

