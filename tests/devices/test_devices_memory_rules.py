"""Each engine sizes its KV cache by its own rule (engines.toml ``memory``, ``MemoryRule``):
vLLM's share of capacity holds weights, activations and KV; SGLang's static share holds weights
and KV, activations live outside it, and its default share is capacity less a reserve that
grows with the step budget and the ranks; TensorRT-LLM's KV takes a share of what weights and
activations leave free. Checked by what each rule must do when one input moves."""

from __future__ import annotations

import pytest

from devices import BatchShape, DeploymentSpec, catalog, estimate, place, step_cost
from devices.specs import MIB

H100 = catalog.get_chip("h100-sxm").tier.capacity_bytes
PER_TOKEN = 2 * 32 * 8 * 128 * 2  # Llama 3.1 8B bf16: K and V, 32 layers, 8 KV heads of 128


def _kv(engine: str, chip: str = "h100-sxm", **kw) -> float:
    """KV bytes per chip of Llama 3.1 8B bf16 (one chip: tp 1)."""
    return place(_spec(engine, chip, **kw)).kv_tokens * PER_TOKEN


def _spec(engine: str, chip: str = "h100-sxm", **kw) -> DeploymentSpec:
    return DeploymentSpec(model="llama-3.1-8b", quant="bf16", chip=chip, engine=engine,
                          max_context=8192, **kw)


def test_activations_count_inside_vllms_share_outside_sglangs_and_before_tensorrts():
    """A bigger step budget needs more activation memory: vLLM's KV loses all of it, the
    TensorRT-LLM KV the share of it (its share is of what is left free), SGLang's none (its
    static share holds only weights and KV)."""
    def delta(engine: str) -> float:  # (one sequence: vLLM's sampler warm-up stays smaller)
        share = {"gpu_mem_utilisation": 0.8, "max_batch": 1}
        return (_kv(engine, max_batched_tokens=2048, **share)
                - _kv(engine, max_batched_tokens=16384, **share))

    activations = delta("vllm")
    assert activations > 100 * PER_TOKEN  # a real difference, ~1 GB
    assert delta("tensorrt-llm") == pytest.approx(0.8 * activations, abs=2 * PER_TOKEN)
    assert abs(delta("sglang")) <= PER_TOKEN


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_share_of_capacity_moves_the_kv_cache_by_that_much_of_capacity(engine):
    lost = _kv(engine, gpu_mem_utilisation=0.9) - _kv(engine, gpu_mem_utilisation=0.6)
    assert lost == pytest.approx(0.3 * H100, abs=PER_TOKEN)


def test_vllm_sets_aside_its_sampler_warm_up_over_the_sequence_cap():
    """vLLM 0.33.0 profiles a sampler warm-up over max_num_seqs × vocabulary logits, 14 bytes
    each (engines.toml): above one step's own activations every extra sequence costs the KV
    pool 14 × vocab bytes; below them the sequence cap costs nothing. TensorRT-LLM's rule
    profiles no sampler."""
    assert catalog.get_engine("vllm").memory.sampler_bytes == 14
    vocab = catalog.get_model("llama-3.1-8b").vocab
    big, bigger = (place(_spec("vllm", max_batch=n)).kv_pool_bytes for n in (2048, 4096))
    assert big - bigger == pytest.approx(14 * 2048 * vocab, rel=1e-9)
    one, two = (place(_spec("vllm", max_batch=n)).kv_pool_bytes for n in (1, 2))
    assert one == two
    trt = [place(_spec("tensorrt-llm", max_batch=n)).kv_pool_bytes for n in (1, 4096)]
    assert trt[0] == trt[1]


def test_shares_are_of_the_memory_the_device_reports_not_the_vendors_figure():
    """An H100 "80 GB" reports 81,559 MiB to software (chips.toml ``reported_mib``), and an
    engine's share is of that: the KV cache holds 0.3 of it more at 0.9 than at 0.6."""
    tier = catalog.get_chip("h100-sxm").tier
    assert tier.nominal == 80e9 and tier.capacity_bytes == 81559 * MIB
    lost = _kv("vllm", gpu_mem_utilisation=0.9) - _kv("vllm", gpu_mem_utilisation=0.6)
    assert lost > 0.3 * tier.nominal + 100 * PER_TOKEN  # more than the vendor's figure gives


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tensorrt-llm"])
def test_the_kv_pool_is_what_the_rule_leaves_and_holds_the_kv_tokens(engine):
    """``kv_pool_bytes`` (vLLM's "Available KV cache memory", compared with engines' start-up
    logs in docs/FIDELITY.md) is the rule's bytes before rounding to whole tokens."""
    hi, lo = (place(_spec(engine, gpu_mem_utilisation=u)) for u in (0.9, 0.6))
    assert hi.kv_tokens == hi.kv_pool_bytes // PER_TOKEN
    moved = hi.kv_pool_bytes - lo.kv_pool_bytes
    cap = catalog.get_chip("h100-sxm").tier.capacity_bytes
    free = hi.kv_pool_bytes / 0.9  # TensorRT-LLM's share is of the free memory
    assert moved == pytest.approx(0.3 * (free if engine == "tensorrt-llm" else cap), rel=1e-9)


def test_every_device_memory_carries_the_total_it_reports():
    """Every chip whose weights sit in its own device memory (HBM, VRAM) carries the total its
    driver reports, and that total is the vendor's binary gigabytes written decimal (up to
    7.4 % more) less what the driver keeps, never less than the vendor's figure."""
    chips = [c for c in catalog.list_chips(None) if c.placement == "sharded"]
    assert len(chips) >= 10
    for chip in chips:
        tier = chip.tier
        assert tier.nominal_bytes, f"{chip.id}: no reported_mib in chips.toml"
        assert 1.0 < tier.capacity_bytes / tier.nominal <= 2**30 / 1e9, chip.id


def test_tensorrts_share_is_of_the_free_memory():
    full, half = _kv("tensorrt-llm", gpu_mem_utilisation=1.0), _kv("tensorrt-llm",
                                                                  gpu_mem_utilisation=0.5)
    assert half == pytest.approx(full / 2, abs=PER_TOKEN)


def test_the_reported_share_is_the_engines_default_or_the_deployments():
    assert place(_spec("vllm")).memory_share == catalog.get_engine("vllm").memory.fraction
    assert place(_spec("tensorrt-llm")).memory_share == 0.9
    assert place(_spec("sglang", gpu_mem_utilisation=0.7)).memory_share == 0.7
    apple = place(DeploymentSpec("llama-3.1-8b", "mlx-4bit", "m4-max-40", "mlx"))
    assert apple.memory_share == catalog.get_chip("m4-max-40").usable_fraction


def _sglang_share(**kw) -> float:
    return place(_spec("sglang", **kw)).memory_share


def test_sglangs_default_share_leaves_its_reserve():
    """(capacity − reserve) / capacity, the reserve growing by 1.5 MiB per token of the step
    budget, 2 MiB per sequence of the decode graphs and 128 MiB per rank (SGLang 0.5.23)."""
    mib = H100 / MIB
    base = _sglang_share()
    assert 0.8 < base < 0.85  # ~13 GiB reserved on an 80 GB GPU
    assert _sglang_share(max_batched_tokens=16384) == pytest.approx(
        base - 1.5 * 8192 / mib, abs=1e-3)
    assert _sglang_share(max_batch=128) == pytest.approx(base + 2 * 128 / mib, abs=1e-3)
    two = place(_spec("sglang", tp=2)).memory_share
    assert two == pytest.approx(base - 128 / mib, abs=1e-3)


def test_sglang_keeps_at_least_10_gib_on_gpus_above_60_gib_only():
    small_reserve = dict(max_batched_tokens=2048, max_batch=8)  # 3.7 GiB by the formula
    mib = H100 / MIB
    assert _sglang_share(**small_reserve) == pytest.approx((mib - 10240) / mib, abs=1e-3)
    vram = catalog.get_chip("rtx-4090").tier.capacity_bytes / MIB  # 22.4 GiB: no floor
    share = _sglang_share(chip="rtx-4090", **small_reserve)
    assert share == pytest.approx((vram - 512 - 1.5 * 2048 - 128 - 2 * 8) / vram, abs=1e-3)
    # by default: its 4096-token chunks, and decode graphs up to 48 sequences on a 24 GB GPU
    short = DeploymentSpec("llama-3.1-8b", "bf16", "rtx-4090", "sglang", max_context=2048)
    assert place(short).memory_share == pytest.approx(
        (vram - 512 - 1.5 * 4096 - 128 - 2 * 48) / vram, abs=1e-3)


@pytest.mark.parametrize(("engine", "chip", "seqs", "tokens"), [
    ("vllm", "rtx-4090", 256, 2048), ("vllm", "h100-sxm", 1024, 8192),
    ("vllm", "b200", 1024, 16384), ("vllm", "a100-sxm-80g", 256, 2048),
    ("sglang", "rtx-4090", None, 4096), ("sglang", "h100-sxm", None, 8192),
    ("sglang", "b200", None, 16384),  # SGLang's cap comes from its KV pool (KvSeqs)
])
def test_step_budgets_follow_the_gpus_memory(engine, chip, seqs, tokens):
    """vLLM 0.33.0 and SGLang 0.5.23 pick bigger chunks (vLLM also more sequences) on bigger
    GPUs; vLLM keeps the A100 (80 GiB) on its small defaults, by device name."""
    spec = catalog.get_chip(chip)
    got = catalog.get_engine(engine).scheduler.for_chip(spec.tier.capacity_bytes, spec.name)
    assert got[1:] == (seqs, tokens)


def test_an_unplaceable_deployment_says_what_the_share_must_hold():
    with pytest.raises(Exception, match=r"weights .* \+ KV for .* > .*0\.5 of 85\.5 GB reported"):
        place(DeploymentSpec("llama-3.1-70b", "fp8", "h100-sxm", "sglang",
                             gpu_mem_utilisation=0.5))
    with pytest.raises(Exception, match=r"0\.9 of 85\.5 GB reported left free by weights"):
        place(DeploymentSpec("llama-3.1-70b", "bf16", "h100-sxm", "tensorrt-llm"))


def test_estimate_reports_the_share_its_kv_comes_from():
    point = estimate(_spec("sglang"), prompt=512, output=16)
    assert point["memory_share"] == _sglang_share() < 0.9
    assert point["kv_tokens"] == place(_spec("sglang")).kv_tokens


def test_every_engine_placed_on_sharded_memory_declares_its_rule():
    """No engine falls back silently: each one `place_hbm` can receive says how it sizes KV."""
    for engine in catalog.list_engines():
        for chip in catalog.list_chips():
            if chip.placement == "sharded" and chip.chip_class in engine.chip_classes \
                    and not (engine.offload and chip.host):
                assert engine.memory is not None, (engine.id, chip.id)
    assert catalog.get_engine("mlx").memory is None  # unified memory: Metal's working set


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tensorrt-llm"])
def test_kv_cache_memory_bytes_sizes_the_pool_whatever_the_share(engine):
    """vLLM's --kv-cache-memory-bytes: that many bytes of KV on each chip, the share ignored."""
    size = 8 * 10**9
    for share in (0.5, 0.9):
        one = place(_spec(engine, kv_cache_memory_bytes=size, gpu_mem_utilisation=share))
        assert one.kv_tokens == size // PER_TOKEN
    two = place(_spec(engine, tp=2, kv_cache_memory_bytes=size))  # each chip: half the heads
    assert two.kv_tokens == size // (PER_TOKEN // 2)
    too_big = r"kv_cache_memory_bytes 70\.0 GB per chip > the 85\.5 GB reported"
    with pytest.raises(Exception, match=too_big):
        place(_spec(engine, kv_cache_memory_bytes=70 * 10**9))


def test_cpu_offload_keeps_weights_in_host_memory_and_reads_them_every_step():
    """vLLM's --cpu-offload-gb (UVA): the GPU holds that much less weight (its KV pool gains
    it), and every forward pass reads those bytes over the host link instead of VRAM."""
    off = 10 * 2**30
    plain = place(_spec("vllm", "rtx-4090"))
    offloaded = place(_spec("vllm", "rtx-4090", cpu_offload_bytes=off))
    assert dict(offloaded.weight_bytes)["host_dram"] == pytest.approx(off)
    assert (offloaded.kv_tokens - plain.kv_tokens) * PER_TOKEN == pytest.approx(off,
                                                                                abs=PER_TOKEN)
    chip = offloaded.chip
    bw_eff = dict(plain.factors)[chip.chip_class].bw_eff
    one = BatchShape(decode=(512,))  # batch 1: a memory-bound step
    slower = step_cost(offloaded, one).seconds - step_cost(plain, one).seconds
    assert slower == pytest.approx(off / chip.host_link_bw_bps
                                   - off / (chip.tier.bandwidth_bps * bw_eff), rel=1e-6)


def test_cpu_offload_fits_a_model_the_gpu_cannot_hold_and_only_where_the_engine_offers_it():
    big = dict(model="llama-3.1-70b", quant="bf16", chip="h100-sxm")
    with pytest.raises(Exception, match="does not fit"):
        place(DeploymentSpec(**big, engine="vllm"))
    assert place(DeploymentSpec(**big, engine="sglang", cpu_offload_bytes=80 * 2**30)).chips == 1
    with pytest.raises(Exception, match="does not keep weights in host memory"):
        place(DeploymentSpec(**big, engine="tensorrt-llm", cpu_offload_bytes=80 * 2**30))
