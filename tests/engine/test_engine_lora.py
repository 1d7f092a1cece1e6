"""LoRA in the engine: vLLM's max_loras rule, prefix cache keyed by adapter, the adapters' cost
on the emulated timeline, the registry's checks (issue 13)."""

from __future__ import annotations

import dataclasses

import pytest

from devices import DeploymentSpec, place
from devices.lora import LoraCostModel, adapter_bytes
from server.engine.build import build_core
from server.engine.lora import LoraConfig, LoraError, LoraRegistry, parse_module
from server.engine.options import EngineOptions
from server.engine.request import Request, SamplingParams
from tests.engine.engine_drive import make, request, run

H100 = EngineOptions(name="t", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                     engine="vllm", prefix_cache=True, output_len_dist="fixed")


def with_lora(req: Request, lora_id: int) -> Request:
    req.lora_id = lora_id
    return req


def test_two_adapters_serialize_with_max_loras_1() -> None:
    """vLLM v1: a waiting request whose adapter would be a second one in the batch waits;
    base-model requests and requests of the running adapter are not held back."""
    sched, model = make(max_loras=1)
    first_step: dict[str, int] = {}
    last_step: dict[str, int] = {}
    reqs = [with_lora(request("a1", [1] * 20, 8, ignore_eos=True), 1),
            with_lora(request("b1", [2] * 20, 8, ignore_eos=True), 2),
            with_lora(request("a2", [3] * 20, 8, ignore_eos=True), 1),
            request("base", [4] * 20, 8, ignore_eos=True)]
    for r in reqs:
        sched.add_request(r)

    def before(s, n: int) -> None:  # who ran in the previous step
        for r in s.running:
            first_step.setdefault(r.request_id, n)
            last_step[r.request_id] = n
        assert len({r.lora_id for r in s.running if r.lora_id}) <= 1

    run(sched, model, before_step=before)
    # a2 (same adapter) and base run alongside a1; b1 starts only after a1 and a2 are done
    assert first_step["a2"] == first_step["a1"] == first_step["base"]
    assert first_step["b1"] > max(last_step["a1"], last_step["a2"])


def test_max_loras_2_runs_both_adapters_together() -> None:
    sched, _ = make(max_loras=2)
    for i, lora in enumerate((1, 2)):
        sched.add_request(with_lora(request(f"r{i}", [i + 1] * 20, 4, ignore_eos=True), lora))
    sched.schedule()
    assert {r.lora_id for r in sched.running} == {1, 2}


def test_deferred_count_is_reported() -> None:
    sched, _ = make(max_loras=1)
    sched.add_request(with_lora(request("a", [1] * 20, 4), 1))
    sched.add_request(with_lora(request("b", [2] * 20, 4), 2))
    sched.schedule()
    assert sched.stats.num_lora_deferred == 1 and sched.num_waiting == 1


def test_prefix_cache_is_keyed_by_adapter() -> None:
    prompt = list(range(1, 65))  # 4 full blocks
    sched, model = make(max_loras=4)
    sched.add_request(with_lora(request("warm", prompt, 2), 1))
    run(sched, model)
    for rid, lora in (("same", 1), ("other", 2), ("base", 0)):
        r = with_lora(request(rid, prompt, 2), lora)
        sched.add_request(r)
        run(sched, model)
        expected = 48 if lora == 1 else 0  # at most all but the last token, block-aligned
        assert r.num_cached_tokens == expected, rid
    sched.check_integrity()


def test_adapter_cost_grows_with_rank_and_load_is_charged_once() -> None:
    def timeline(rank: int) -> list[float]:
        opts = dataclasses.replace(H100, enable_lora=True, max_lora_rank=64, lora_modules=(
            f'{{"name": "ad", "path": "/adapters/ad", "rank": {rank}}}',))
        core = build_core(opts)
        req = Request("r", list(range(1, 200)), SamplingParams(max_tokens=6, ignore_eos=True))
        req.lora_id = core.lora.adapters["ad"].id
        core.add_request(req)
        out = []
        while core.has_unfinished():
            out.append(core.step().seconds)
        assert core.stats.lora_loads == 1  # the first step copied it; later steps reuse it
        return out

    base_core = build_core(H100)
    base_core.add_request(Request("r", list(range(1, 200)),
                                  SamplingParams(max_tokens=6, ignore_eos=True)))
    base = []
    while base_core.has_unfinished():
        base.append(base_core.step().seconds)
    r8, r64 = timeline(8), timeline(64)
    model = LoraCostModel(place(H100.spec()))
    assert all(b < s8 < s64 for b, s8, s64 in zip(base, r8, r64, strict=True))
    # the first step carries the copy over PCIe on top of the per-step matmuls
    assert r64[0] - r64[1] > model.load_seconds(64) * 0.9
    assert r64[1] == pytest.approx(r64[2], rel=0.05)


def test_adapter_bytes_from_model_shapes() -> None:
    model = place(DeploymentSpec(model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                                 engine="vllm")).model
    # Llama-3.1-8B, all-linear at rank 16: 32 layers × 16 × (q 8192 + k 5120 + v 5120 + o 8192
    # + gate 18432 + up 18432 + down 18432) params × 2 bytes
    assert adapter_bytes(model, 16) == 32 * 16 * (8192 + 5120 * 2 + 8192 + 18432 * 3) * 2


def test_registry_checks_and_lru() -> None:
    reg = LoraRegistry(LoraConfig(True, max_loras=1, max_cpu_loras=2,
                                  modules=("a=/p/a", '{"name": "b", "path": "/p/b"}')))
    assert [a.id for a in reg.listing()] == [1, 2]
    with pytest.raises(LoraError, match="already been loaded"):
        reg.load("a", "/p/a")
    with pytest.raises(LoraError) as e:
        reg.unload("nope")
    assert e.value.status == 404
    assert [a.name for a in reg.activate([1])] == ["a"]
    assert reg.activate([1]) == []  # resident
    assert [a.name for a in reg.activate([2])] == ["b"]  # one device slot: a is evicted
    assert [a.name for a in reg.activate([1])] == ["a"]
    reg.unload("a")
    assert reg.load("c", "/p/c").id == 3  # ids are never reused


@pytest.mark.parametrize("bad", [
    dict(max_lora_rank=17), dict(max_loras=0), dict(max_loras=2, max_cpu_loras=1)])
def test_config_checked_as_vllm(bad: dict) -> None:
    with pytest.raises(LoraError):
        LoraConfig(True, **bad)


def test_lora_modules_forms() -> None:
    assert parse_module("x=/a/b", 16) == ("x", "/a/b", "", 16)
    assert parse_module('{"name": "x", "path": "/a", "base_model_name": "m", "rank": 8}',
                        16) == ("x", "/a", "m", 8)
    for bad in ("x", '{"name": "x"}', '{"name": "x", "path": "/a", "rank": 32}'):
        with pytest.raises(LoraError):
            parse_module(bad, 16)


def test_fleet_file_lora_keys_are_checked() -> None:
    from server.config import ConfigError, parse_fleet

    table = {"name": "l", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
             "engine": "vllm", "enable_lora": True, "lora_modules": ["a=/p/a"]}
    fleet = parse_fleet({"deployments": [table]})
    assert fleet.deployments[0].lora_config().modules == ("a=/p/a",)
    with pytest.raises(ConfigError, match="max_lora_rank"):
        parse_fleet({"deployments": [{**table, "max_lora_rank": 12}]})
    with pytest.raises(ConfigError, match="enable_lora"):
        parse_fleet({"deployments": [{**table, "enable_lora": False}]})
