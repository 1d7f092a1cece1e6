"""llama.cpp placement over three tiers: VRAM, host RAM (CPU compute) and the SSD under mmap.

``n_gpu_layers`` layers (default: as many as fit) live in VRAM with their KV; the rest are
computed by the CPU from host RAM. The GGUF file is mmapped, so the CPU layers are in the OS
page cache; when they exceed free RAM the LRU cache misses and they are re-read from SSD (see
``devices.pagecache``). Decode runs CPU layers on the CPU at host-memory bandwidth; a step of
32 tokens or more copies CPU-resident weights over PCIe and computes them on the GPU
(llama.cpp's offloaded prefill), so it is bounded by PCIe bandwidth.
"""

from __future__ import annotations

from devices import catalog
from devices.deployment import DeploymentSpec
from devices.errors import PlacementError
from devices.pagecache import chunks_of, steady_state_miss_bytes
from devices.parallel import Parallelism
from devices.placed import (
    DEFAULT_CONTEXT_CONTIGUOUS,
    FactorTable,
    Placement,
    attention_fields,
    factors_for,
    kv_element_bytes,
    moe_fields,
    read_bytes,
)
from devices.plan import Plan, Segment, Stage, compute_rate, make_segment
from devices.specs import ChipSpec, EngineSpec, ModelSpec, QuantSpec

OFFLOAD_MIN_TOKENS = 32  # llama.cpp moves CPU-layer matmuls to the GPU from this batch size


def place_offload(
    spec: DeploymentSpec,
    model: ModelSpec,
    quant: QuantSpec,
    chip: ChipSpec,
    engine: EngineSpec,
    table: FactorTable,
) -> Placement:
    if (spec.count or 1) > 1 or (spec.tp or 1) > 1 or (spec.pp or 1) > 1 or (spec.ep or 1) > 1:
        raise PlacementError(f"{engine.name} with offload runs on one GPU (or the CPU) here")
    if spec.speculative is not None:
        raise PlacementError(f"{engine.name} speculative decoding is not emulated")
    cpu_only = chip.kind == "host"
    host = catalog.get_chip(spec.host or (chip.id if cpu_only else chip.host or ""))
    ssd = catalog.get_chip(spec.ssd or chip.ssd or host.ssd or "nvme-gen4")
    n_ctx = spec.max_context or min(model.max_context, DEFAULT_CONTEXT_CONTIGUOUS)
    layer_w = quant.layer_bytes(model.dense_layer_params, model.mlp_params_per_layer)
    head_w = quant.edge_bytes(model.head_params)
    kvb = kv_element_bytes(spec, quant)
    kv_layer = model.kv_bytes_for_context(n_ctx, kvb) / model.n_layers
    if cpu_only:
        ngl = 0
    else:
        # ASSUMPTION: llama.cpp's compute buffer ≈ ubatch × (vocab + 4·hidden + 3·ffn) fp32.
        ubatch = engine.scheduler.max_num_batched_tokens or n_ctx
        buf = ubatch * (model.vocab + 4 * model.hidden + 3 * model.ffn) * 4
        vram = chip.tier.capacity_bytes * chip.usable_fraction - buf
        per_layer = layer_w + kv_layer
        if spec.n_gpu_layers is None:
            fits_all = model.n_layers * per_layer + head_w <= vram
            ngl = model.n_layers + 1 if fits_all else min(model.n_layers, int(vram // per_layer))
        else:
            ngl = max(0, min(spec.n_gpu_layers, model.n_layers + 1))
            need = min(ngl, model.n_layers) * per_layer + (head_w if ngl > model.n_layers else 0)
            if need > vram:
                raise PlacementError(
                    f"n_gpu_layers={ngl} needs {need / 1e9:.1f} GB of VRAM; {chip.id} has "
                    f"{vram / 1e9:.1f} GB free: lower n_gpu_layers"
                )
    gpu_layers = min(ngl, model.n_layers)
    head_gpu = ngl > model.n_layers
    cpu_layers = model.n_layers - gpu_layers
    cpu_w = cpu_layers * layer_w + (0 if head_gpu else head_w)
    # The embedding table's rows are touched sparsely, so it is left out of the page cache.
    ram_free = host.tier.capacity_bytes - host.os_reserve_bytes - cpu_layers * kv_layer
    if cpu_w > ram_free + ssd.tier.capacity_bytes:
        raise PlacementError(f"{model.name} {quant.id} exceeds host RAM + SSD")
    if ram_free <= 0:
        raise PlacementError(f"KV of {cpu_layers} CPU layers at n_ctx={n_ctx} exceeds host RAM")
    sizes = [layer_w] * cpu_layers + ([] if head_gpu else [head_w])
    miss = steady_state_miss_bytes(chunks_of(sizes), ram_free) if sizes else 0.0
    resident_cpu = cpu_w - miss
    f_cpu = factors_for(table, engine.id, host.chip_class)
    host_bw = host.tier.bandwidth_bps * f_cpu.bw_eff
    ssd_bw = ssd.tier.bandwidth_bps
    segments: list[Segment] = []
    notes: list[str] = []
    weight_bytes = {host.tier.name: resident_cpu, ssd.tier.name: miss}
    if miss:
        notes.append(f"{miss / 1e9:.1f} GB of CPU layers re-read from SSD every token (LRU)")
    if not cpu_only:
        f_gpu = factors_for(table, engine.id, chip.chip_class)
        gpu_bw = chip.tier.bandwidth_bps * f_gpu.bw_eff
        gpu_w = read_bytes(model, quant, gpu_layers, 1.0 if head_gpu else 0.0)
        weight_bytes[chip.tier.name] = gpu_w
        if gpu_layers or head_gpu:
            segments.append(
                make_segment(
                    model=model, quant=quant, engine=engine, chip=chip, f=f_gpu,
                    layers=gpu_layers, head_share=1.0 if head_gpu else 0.0,
                    weight_reads=((chip.tier.name, gpu_w, gpu_bw),),
                    kv_tier=chip.tier.name, kv_bw=gpu_bw, kv_bytes=kvb,
                )
            )
    if cpu_layers or not head_gpu:
        alt = None
        if not cpu_only:
            pcie = chip.host_link_bw_bps
            alt = make_segment(
                model=model, quant=quant, engine=engine, chip=chip, f=f_gpu, layers=cpu_layers,
                head_share=0.0 if head_gpu else 1.0,
                weight_reads=(
                    (host.tier.name, resident_cpu, pcie),
                    (ssd.tier.name, miss, 1 / (1 / ssd_bw + 1 / pcie)),
                ),
                kv_tier=host.tier.name, kv_bw=host_bw, kv_bytes=kvb,
                rate=compute_rate(engine, chip, quant, f_gpu),
            )
        segments.append(
            make_segment(
                model=model, quant=quant, engine=engine, chip=host, f=f_cpu, layers=cpu_layers,
                head_share=0.0 if head_gpu else 1.0,
                weight_reads=(
                    (host.tier.name, resident_cpu, host_bw), (ssd.tier.name, miss, ssd_bw)
                ),
                kv_tier=host.tier.name, kv_bw=host_bw, kv_bytes=kvb, prefill_alt=alt,
            )
        )
    box = host if cpu_only else chip
    plan = Plan(
        stages=(Stage(tuple(segments), 1, 1, box.busy_watts - box.idle_watts),),
        hop_fixed_s=0.0, hop_tok_s=0.0, n_hops=0, idle_w=box.idle_watts,
        usd_per_s=box.usd_per_hour / 3600, offload_min_tokens=OFFLOAD_MIN_TOKENS,
        **attention_fields(model),  # type: ignore[arg-type]
        **moe_fields(model, Parallelism(1, 1, 1, 1)),  # type: ignore[arg-type]
    )
    # llama.cpp allocates exactly n_ctx (one slot) up front; an encoder (BERT) gets no KV cache
    kv_tokens = n_ctx if model.holds_kv else 0
    factors = [(host.chip_class, f_cpu)] + ([] if cpu_only else [(chip.chip_class, f_gpu)])
    total = sum(weight_bytes.values())
    return Placement(
        spec=spec, model=model, quant=quant, chip=chip, engine=engine, chips=1, tp=1, pp=1,
        n_gpu_layers=ngl, weight_bytes=tuple((k, v) for k, v in weight_bytes.items() if v),
        kv_tokens=kv_tokens, max_context=n_ctx, factors=tuple(factors),
        load_seconds=total / ssd_bw, notes=tuple(notes), plan=plan, kv_bytes=kvb,
        memory_share=chip.usable_fraction,
    )
