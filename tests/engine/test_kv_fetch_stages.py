"""vLLM 0.33.0's async KV loads by stage (`vllm:num_requests_kv_fetch_by_stage`), as far as the
scheduler sees them: a pull not started or a load the device cannot hold yet is
`waiting_to_start`, a load from the CPU tier or a pull in flight is `in_progress`, and a
waiting request holding what a load brought is `completed_waiting` until it runs. However the
request ends, it leaves every stage (the scheduler's invariants checked after every step)."""

from __future__ import annotations

import random

from engine_drive import make, request

from server.engine.build import build_core
from server.engine.kv_pulls import RemotePulls
from server.engine.options import EngineOptions
from server.engine.request import RequestStatus
from server.engine.tokenizer import get_tokenizer
from server.engine_proc.info import connector_info, placed_info
from server.engine_proc.stats import EngineStats

# 16-token blocks (vLLM 0.34.0's default is 64): the 420-token prompts below are sized so that
# the 64 blocks evict one, and cannot reload it beside a running request
BASE = dict(name="a", model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm",
            kv_blocks=64, block_size=16, max_model_len=2048)  # a device cache of 1,024 tokens


def tick(sched, t: float):
    """One schedule at emulated time `t`, its sampled tokens given, the invariants checked."""
    out = sched.schedule(t)
    sched.update(out, {s.request_id: [5] for s in out.scheduled if s.samples_token})
    sched.check_integrity()
    return out


def test_a_pull_that_landed_is_completed_waiting_until_it_runs():
    """Loads take no seat (as vLLM's): with one seat free, two pulls start together; the
    first to land runs, the other waits holding its KV until the seat frees. A pull expected
    while the seat is taken has not started."""
    sched, _ = make(num_blocks=64, block_size=16, max_num_seqs=1)
    link = [0.0]

    def timing(rid: str, n: int, start: float) -> float:  # one second each, in turn
        link[0] = max(start, link[0]) + 1.0
        return link[0]

    sched.attach_pulls(RemotePulls(timing, lambda rid, landed: None))
    prompt = [(7 * i) % 997 + 1 for i in range(100)]

    def pulled(rid: str) -> None:
        req = request(rid, prompt, 4, ignore_eos=True)
        req.num_remote_tokens = len(prompt) - 1
        sched.add_request(req)

    pulled("a")
    pulled("b")
    assert sched.kv_fetch_stages() == (2, 0, 0)
    tick(sched, 0.0)
    assert sched.kv_fetch_stages() == (0, 2, 0)
    tick(sched, 1.0)  # a landed and runs
    assert sched.kv_fetch_stages() == (0, 1, 0)
    assert sched.requests["a"].status == RequestStatus.RUNNING
    pulled("c")  # the seat is a's: its pull waits
    t = 2.0
    tick(sched, t)  # b landed: it waits for the seat
    while sched.requests["b"].status == RequestStatus.WAITING:
        assert sched.kv_fetch_stages() == (1, 0, 1)
        t += 0.1
        tick(sched, t)
    assert sched.requests["b"].status == RequestStatus.RUNNING
    assert sched.kv_fetch_stages() == (1, 0, 0)
    sched.abort("c")
    sched.check_integrity()
    assert sched.kv_fetch_stages() == (0, 0, 0)


def test_a_load_from_the_cpu_tier_goes_through_every_stage(tmp_path):
    opts, tok = EngineOptions(**BASE, kv_offloading_size=1.0, max_num_seqs=2), get_tokenizer()
    core = build_core(opts, tok)
    sched = core.scheduler
    stats = EngineStats(tmp_path / "e.stats", placed_info(opts, 0, core, tok), 0, 1)

    def written() -> tuple[float, ...]:
        """What a scrape would read: the stages, then the waiting count by reason."""
        stats.idle(core, sched.num_waiting, sched.kv_fetch_stages(), t)
        return (*(stats.a[stats.slot("vllm:num_requests_kv_fetch_by_stage", s)]
                  for s in ("waiting_to_start", "in_progress", "completed_waiting")),
                *(stats.a[stats.slot("vllm:num_requests_waiting_by_reason", r)]
                  for r in ("capacity", "deferred")))
    rng = random.Random(0)
    first, *others = [[rng.randrange(1000, 20000) for _ in range(420)] for _ in range(3)]
    t = 0.0
    for i, p in enumerate([first, *others]):  # each alone: the device evicts `first`
        sched.add_request(request(f"w{i}", p, 2, ignore_eos=True))
        while core.has_unfinished():
            t += core.step(t).seconds
    # a running request holds 44 of the 64 blocks: `first`'s 27 cannot be held yet
    sched.add_request(request("big", list(range(3000, 3700)), 50, ignore_eos=True))
    sched.add_request(request("again", first, 4, ignore_eos=True))
    tick(sched, t)
    assert sched.requests["again"].status == RequestStatus.WAITING
    assert sched.kv_fetch_stages() == (1, 0, 0)  # waiting_to_start
    assert written() == (1, 0, 0, 1, 0)  # not started: waiting for capacity

    sched.abort("big")
    for rid in ("c1", "c2"):  # they take both seats while `again` loads
        sched.add_request(request(rid, list(range(5000, 5020)), 400, ignore_eos=True))
    out = tick(sched, t)
    assert [s.request_id for s in out.scheduled] == ["c1", "c2"]
    assert sched.requests["again"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.kv_fetch_stages() == (0, 1, 0)  # in_progress
    assert written() == (0, 1, 0, 0, 1)  # deferred from the load's start (vLLM's skip_request)

    (load,) = sched.offload.loads.values()
    tick(sched, load.ready_at)  # landed, but no seat is free
    assert sched.requests["again"].status == RequestStatus.WAITING
    assert sched.kv_fetch_stages() == (0, 0, 1)  # completed_waiting
    assert written() == (0, 0, 1, 0, 1)  # still deferred until it is scheduled

    sched.abort("c1")
    out = tick(sched, load.ready_at)
    assert "again" in [s.request_id for s in out.scheduled]
    assert sched.kv_fetch_stages() == (0, 0, 0)
    assert written() == (0, 0, 0, 0, 0)


def test_the_gauge_is_a_kv_consumers_as_vllm_registers_it():
    """vLLM registers it where `kv_transfer_config.is_kv_consumer`: a NIXL kv_consumer or
    kv_both, and the CPU tier (`--kv-offloading-size` is an OffloadingConnector, kv_both)."""
    def consumer(**options) -> bool:
        opts = EngineOptions(**BASE, **options)
        return connector_info(opts, build_core(opts))["kv_consumer"]

    def nixl(role: str) -> str:
        return f'{{"kv_connector": "NixlConnector", "kv_role": "{role}"}}'

    assert not consumer()
    assert not consumer(kv_transfer_config=nixl("kv_producer"))
    assert consumer(kv_transfer_config=nixl("kv_consumer"))
    assert consumer(kv_transfer_config=nixl("kv_both"))
    assert consumer(kv_offloading_size=1.0)
