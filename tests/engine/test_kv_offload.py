"""vLLM's CPU KV offloading (`--kv-offloading-size`): a second prefix-cache tier in host memory.

A prompt whose prefix the device cache evicted is not prefilled again: the blocks the tier
kept are loaded back over the chip's host link while other requests run, and the request is
scheduled from the first step after the load ends, with those tokens computed. Every request,
however it ends (a load in flight included), releases what it held in both tiers."""

from __future__ import annotations

import random

import pytest
from engine_drive import request

from clients.conversation import Conversation, Turn
from devices.transfer import host_link, transfer_seconds
from server.engine.build import build_core
from server.engine.kv_events import BlockRemoved, BlockStored
from server.engine.kv_offload import GIB, num_host_blocks
from server.engine.options import EngineOptions
from server.engine.request import RequestStatus
from sim.virtual import run_virtual

# 16-token blocks (vLLM 0.34.0's default is 64): the prompts, tier sizes and connector
# configs below are counted in them
BASE = dict(name="a", model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm",
            kv_blocks=64, block_size=16, max_model_len=2048)  # a device cache of 1,024 tokens
PREFIX = 400


def core_with(**options):
    return build_core(EngineOptions(**{**BASE, **options}))


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 20000) for _ in range(PREFIX + 20)] for _ in range(n)]


def drive(core, t: float = 0.0) -> float:
    """Step the core to the end of its work on the emulated clock (waiting for loads as the
    engine loops do); the integrity of both tiers checked after every step."""
    while core.has_unfinished():
        result = core.step(t)
        if result is None:
            deadline = core.next_deadline()
            assert deadline is not None and deadline > t, "blocked with nothing to wait for"
            t = deadline
            continue
        t += result.seconds
        core.scheduler.check_integrity()
    return t


def serve_in_turn(core, texts: list[list[int]]) -> list[int]:
    """Each prompt alone (the device evicting the older ones); the tokens each prefilled."""
    prefilled, t = [], 0.0
    for i, p in enumerate(texts):
        before = core.scheduler.stats.num_prefill_tokens
        core.add_request(request(f"r{i}", p, 4, ignore_eos=True))
        t = drive(core, t)
        prefilled.append(core.scheduler.stats.num_prefill_tokens - before)
    return prefilled


def test_an_evicted_prefix_is_loaded_from_the_host_instead_of_prefilled():
    texts = prompts(4)
    again = texts + texts  # four prompts of 420 tokens: the device holds two at most
    without = serve_in_turn(core_with(), again)
    tiered = core_with(kv_offloading_size=1.0)
    with_tier = serve_in_turn(tiered, again)
    assert without[4:] == without[:4]  # evicted: prefilled whole again
    assert with_tier[:4] == without[:4]
    block = tiered.scheduler.config.block_size
    loaded = PREFIX + 20 - 1 - (PREFIX + 20 - 1) % block  # whole blocks, the last token computed
    assert with_tier[4:] == [PREFIX + 20 - loaded] * 4
    st = tiered.scheduler.stats
    assert st.host_prefix_cache_hits == st.external_prefix_cache_hits == 4 * loaded
    assert tiered.scheduler.offload.stats.loads == 4


def test_the_request_waits_for_its_load_on_the_host_link_while_others_run():
    core = core_with(kv_offloading_size=1.0)
    first, other = prompts(2)
    serve_in_turn(core, [first, other, prompts(1, seed=9)[0]])  # `first` left the device
    tier = core.scheduler.offload
    core.add_request(request("again", first, 4, ignore_eos=True))
    core.add_request(request("busy", list(range(3000, 3100)), 4, ignore_eos=True))
    out = core.scheduler.schedule(10.0)
    again = core.scheduler.requests["again"]
    assert again.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    device_hit = again.num_computed_tokens  # what the device still had of it
    assert [s.request_id for s in out.scheduled] == ["busy"]  # it ran meanwhile
    (load,) = tier.loads.values()
    link = host_link(core.placement.chip)
    seconds = transfer_seconds(load.num_tokens // tier.block_size * tier.block_bytes, link,
                               core.placement.chips)
    assert load.ready_at == pytest.approx(10.0 + seconds) and seconds > 0
    assert core.next_deadline() == load.ready_at
    core.scheduler.update(out, {"busy": [5]})
    out = core.scheduler.schedule(10.0 + seconds / 2)  # not landed: not scheduled
    assert "again" not in [s.request_id for s in out.scheduled]
    core.scheduler.update(out, {s.request_id: [5] for s in out.scheduled if s.samples_token})
    out = core.scheduler.schedule(load.ready_at)
    (chunk,) = [s for s in out.scheduled if s.request_id == "again"]
    assert chunk.start_position == device_hit + load.num_tokens == 416 and chunk.is_prefill
    core.scheduler.check_integrity()


def test_the_tier_holds_what_its_size_buys_and_evicts_the_least_recent():
    core = core_with(kv_offloading_size=0.03)  # 30 MiB / 2 MiB blocks: 15 blocks, 240 tokens
    tier = core.scheduler.offload
    assert tier.num_blocks == num_host_blocks(int(0.03 * GIB), tier.block_bytes) == 15
    rng = random.Random(1)
    short = [[rng.randrange(1000, 20000) for _ in range(100)] for _ in range(4)]  # 6 blocks
    serve_in_turn(core, short)
    assert tier.cache.cached_blocks <= 15
    assert tier.cache.peek_prefix_len(short[0]) == 0  # the oldest went first
    assert tier.cache.peek_prefix_len(short[3]) == 96
    serve_in_turn(core, prompts(1, seed=5))  # 26 blocks: no room, the store is skipped
    assert tier.stats.allocation_failures == 1


def test_cpu_events_name_the_device_blocks_hashes_with_vllms_payload():
    events = '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557"}'
    plain = core_with(kv_offloading_size=1.0, kv_events_config=events)
    serve_in_turn(plain, prompts(1))
    log = plain.scheduler.cache.events.take()
    gpu = [e for e in log if isinstance(e, BlockStored) and e.medium == "GPU"]
    cpu = [e for e in log if isinstance(e, BlockStored) and e.medium == "CPU"]
    assert [h for e in cpu for h in e.block_hashes] == [h for e in gpu for h in e.block_hashes]
    assert all(len(e.block_hashes) == 1 and e.block_size == 0 and e.token_ids == []
               and e.parent_block_hash is None for e in cpu)  # vLLM's placeholder payload
    extra = '{"cpu_bytes_to_use": 1073741824, "self_describing_kv_events": true}'
    described = core_with(kv_events_config=events, kv_transfer_config=(
        '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", '
        f'"kv_connector_extra_config": {extra}}}'))
    serve_in_turn(described, prompts(1))
    log = described.scheduler.cache.events.take()
    cpu = [e for e in log if isinstance(e, BlockStored) and e.medium == "CPU"]
    gpu = [e for e in log if isinstance(e, BlockStored) and e.medium == "GPU"]
    assert [(e.block_hashes, e.token_ids, e.block_size) for e in cpu] == \
        [(e.block_hashes, e.token_ids, e.block_size) for e in gpu]
    small = core_with(kv_offloading_size=0.03, kv_events_config=events)  # 15 host blocks
    serve_in_turn(small, [[7] * 100, [8] * 100])  # 6 blocks each: they fit
    log = small.scheduler.cache.events.take()
    assert not [e for e in log if isinstance(e, BlockRemoved) and e.medium == "CPU"]
    stored = [h for e in log if isinstance(e, BlockStored) and e.medium == "CPU"
              for h in e.block_hashes]
    serve_in_turn(small, [[9] * 100])  # 6 more: the least recent 3 go
    removed = [h for e in small.scheduler.cache.events.take()
               if isinstance(e, BlockRemoved) and e.medium == "CPU" for h in e.block_hashes]
    assert len(removed) == 3 and set(removed) <= set(stored[:6])


def test_every_request_releases_both_tiers_however_it_ends():
    core = core_with(kv_offloading_size=0.25)
    rng = random.Random(7)
    texts = prompts(6, seed=2)
    t, n = 0.0, 0
    for _ in range(60):
        for _ in range(rng.randrange(1, 4)):
            core.add_request(request(f"q{n}", rng.choice(texts), rng.randrange(1, 12),
                                     ignore_eos=True))
            n += 1
        for _ in range(rng.randrange(1, 6)):
            result = core.step(t)
            t = t + result.seconds if result is not None else (core.next_deadline() or t)
            core.scheduler.check_integrity()
        live = list(core.scheduler.requests)
        for rid in rng.sample(live, k=min(len(live), rng.randrange(0, 3))):
            core.scheduler.abort(rid)  # waiting, running, landed or loading
            core.scheduler.check_integrity()
    drive(core, t)
    sched, tier = core.scheduler, core.scheduler.offload
    assert tier.stats.loads > 0 and sched.stats.num_aborted > 0
    assert sched.pool.num_free + sched.cache.evictable_blocks == sched.pool.num_blocks
    assert not tier.loads and tier.cache.evictable_blocks == tier.cache.cached_blocks


def test_a_virtual_run_is_the_same_macro_or_single_stepped():
    def run(macro: bool):
        core = core_with(kv_offloading_size=0.5, kv_blocks=200)
        rng = random.Random(3)
        sessions = [Conversation(f"c{i}", start_s=i * 0.05, turns=tuple(
            Turn(tuple(rng.randrange(1000, 20000) for _ in range(150)), 40, think_time_s=0.5)
            for _ in range(3))) for i in range(12)]
        out = run_virtual(core, sessions, macro_steps=macro)
        return ([(r.request_id, r.token_times) for r in out.records],
                core.scheduler.stats.host_prefix_cache_hits)
    single, macro = run(False), run(True)
    assert single[1] > 0  # the tier served some turns
    assert macro == single


def connector(**extra) -> str:
    """A --kv-transfer-config naming vLLM's OffloadingConnector with 1 GiB and `extra`."""
    import json

    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30, **extra}})


def test_only_the_prompts_blocks_are_offloaded_unless_told_as_vllms_default():
    def stored(**extra) -> int:
        core = core_with(kv_transfer_config=connector(**extra))
        core.add_request(request("r", prompts(1)[0][:100], 60, ignore_eos=True))
        drive(core)
        return core.scheduler.offload.cache.cached_blocks
    assert stored() == 6  # 100 prompt tokens: 6 whole blocks
    assert stored(offload_prompt_only=False) == 159 // 16  # and the output's computed ones


def test_llm_ds_and_vllms_connector_configs_are_taken_as_vllm_takes_them():
    core = core_with(kv_transfer_config=connector(
        spec_name="CPUOffloadingSpec", blocks_per_chunk=1, store_threshold=0,
        offload_prompt_only=False, some_future_key=True))
    assert core.scheduler.offload.num_blocks == (1 << 30) // (16 * 131072)
    assert core_with(kv_transfer_config=connector(block_size=16)).scheduler.offload


@pytest.mark.parametrize(("extra", "says"), [
    (dict(spec_name="TieringOffloadingSpec"), "spec_name 'TieringOffloadingSpec' is not "),
    (dict(block_size=24), r"'block_size'=24 in kv_connector_extra_config must be a multiple "
                          r"of the GPU KV cache block size \(16 tokens\)\."),
    (dict(block_size=32), "several device blocks is not emulated"),
    (dict(block_size=16, blocks_per_chunk=1), "Specify only one of 'block_size' or "),
    (dict(blocks_per_chunk=2), "blocks_per_chunk > 1 is not emulated"),
    (dict(store_threshold=2), "store_threshold is not emulated"),
])
def test_a_connector_config_not_emulated_is_refused_naming_its_key(extra, says):
    with pytest.raises(ValueError, match=says):
        core_with(kv_transfer_config=connector(**extra))


def test_at_vllms_default_block_the_tier_counts_and_reloads_64_token_blocks():
    """Without --block-size (vLLM 0.34.0's 64 on an H100): a host block is one device block of
    64 tokens, the connector's block size must be a multiple of it, and an evicted 420-token
    prompt comes back as its whole 64-token blocks."""
    default = dict(BASE, kv_blocks=16)  # 1,024 tokens again, in blocks of 64
    del default["block_size"]
    core = build_core(EngineOptions(**default, kv_offloading_size=1.0))
    assert core.scheduler.config.block_size == 64
    assert core.scheduler.offload.num_blocks == (1 << 30) // (64 * 131072)
    texts = prompts(4)
    prefilled = serve_in_turn(core, texts + texts)
    assert prefilled[4:] == [PREFIX + 20 - 384] * 4  # 6 whole blocks of 64 loaded
    with pytest.raises(ValueError, match=r"multiple of the GPU KV cache block size \(64 tok"):
        build_core(EngineOptions(**default, kv_transfer_config=connector(block_size=16)))


@pytest.mark.parametrize(("options", "says"), [
    (dict(kv_offloading_size=4.0, kv_offloading_backend="lmcache"), "LMCache server"),
    (dict(kv_offloading_size=0.0), "must be > 0"),
    (dict(kv_offloading_size=4.0, kv_transfer_config='{"kv_connector": "NixlConnector", '
          '"kv_role": "kv_both"}'), "one connector"),
    (dict(kv_transfer_config='{"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}'),
     "cpu_bytes_to_use must be specified in kv_connector_extra_config"),
    (dict(kv_transfer_config='{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", '
          '"kv_connector_extra_config": {"cpu_bytes_to_use": 1e9, "eviction_policy": "arc"}}'),
     "eviction_policy 'arc' is not emulated"),
    (dict(kv_offloading_size=4.0, prefix_cache=False), "needs the prefix cache on"),
    (dict(kv_offloading_size=4.0, chip="m4-max-40", engine="mlx", quant="mlx-4bit"),
     "no host link"),
    (dict(kv_offloading_size=1e-6), "holds no block"),
])
def test_a_bad_offloading_config_is_a_clear_error(options, says):
    with pytest.raises(ValueError, match=says):
        core_with(**options)


def test_the_prefix_aware_router_counts_the_host_tier_as_llm_ds_scorer_weighs_it():
    from sim.routers import HOST_WEIGHT, PrefixAware, tiered_match

    evicted, other = prompts(2, seed=11)
    tiered = core_with(kv_offloading_size=1.0)
    serve_in_turn(tiered, [evicted, *prompts(4, seed=12)])  # `evicted` left its device
    plain = core_with()
    serve_in_turn(plain, [other[:100]])  # fewer cached blocks: the fallback's choice
    assert tiered.scheduler.cache.peek_prefix_len(evicted) == 0
    assert tiered.scheduler.offload.cache.peek_prefix_len(evicted) == 416
    assert tiered_match(tiered, evicted) == HOST_WEIGHT * 416
    assert tiered_match(plain, evicted) == 0
    router = PrefixAware([plain, tiered])
    assert plain.scheduler.cache.cached_blocks < tiered.scheduler.cache.cached_blocks
    assert router.choose(evicted, [0, 0]) == 1  # its host tier holds the prompt


def test_a_store_never_evicts_the_prefix_it_continues():
    core = core_with(kv_offloading_size=0.03)  # 15 host blocks
    tier = core.scheduler.offload
    head = [5] * 160  # 10 blocks, stored first and least recent
    serve_in_turn(core, [head])
    # 10 more blocks continuing it: the only evictable blocks are its own prefix, which the
    # store needs; so nothing fits and nothing is evicted (before, the count allowed it)
    serve_in_turn(core, [head + [6] * 160])
    assert tier.stats.allocation_failures == 1
    assert tier.cache.peek_prefix_len(head) == 160
    core.scheduler.check_integrity()


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_small_tiers_keep_every_invariant(seed):
    """Tiny device and host pools, prompts sharing prefixes of random lengths, outputs
    stored or not, aborts at random: both tiers' invariants after every step, and both
    idle at the end."""
    rng = random.Random(seed)
    core = core_with(kv_blocks=rng.choice([40, 64, 96]),
                     kv_transfer_config=connector(
                         offload_prompt_only=rng.random() < 0.5,
                         cpu_bytes_to_use=rng.choice([10, 16, 25, 60]) * 2 * 1024 * 1024))
    heads = [[rng.randrange(1000, 20000) for _ in range(rng.randrange(16, 300))]
             for _ in range(4)]
    t, n = 0.0, 0
    for _ in range(80):
        if rng.random() < 0.6:
            prompt = rng.choice(heads)[:rng.randrange(1, 300)] + \
                [rng.randrange(1000, 20000) for _ in range(rng.randrange(1, 60))]
            core.add_request(request(f"f{n}", prompt, rng.randrange(1, 40), ignore_eos=True))
            n += 1
        result = core.step(t)
        t = t + result.seconds if result is not None else (core.next_deadline() or t)
        core.scheduler.check_integrity()
        if core.scheduler.requests and rng.random() < 0.1:
            core.scheduler.abort(rng.choice(list(core.scheduler.requests)))
            core.scheduler.check_integrity()
    drive(core, t)
    sched, tier = core.scheduler, core.scheduler.offload
    assert sched.pool.num_free + sched.cache.evictable_blocks == sched.pool.num_blocks
    assert not tier.loads and not tier.cursors
    assert tier.cache.evictable_blocks == tier.cache.cached_blocks
