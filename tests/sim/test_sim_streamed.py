"""Memory flat with the request count (issue 16): a lazy workload and a streamed summary give
the very run and summary the lists give, while the runner holds only the sessions in flight."""

from __future__ import annotations

import dataclasses

import pytest
from fleet_helpers import H100 as GPU
from fleet_helpers import SRAM, pool

import clients.workloads as workloads
import sim.virtual as virtual
from clients.report import SummaryStream, summarize
from clients.workloads import WorkloadSpec, build_workload, stream_workload
from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from sim.cluster import build_replicas, replica_reports, run_replicas
from sim.pools import pools_of
from sim.reports import FleetStream
from sim.simulation import simulate_conversations, simulate_streamed

H100 = EngineOptions(name="h100", model="llama-2-7b", quant="bf16", chip="h100-sxm",
                     engine="vllm")

KINDS = {
    "random": WorkloadSpec(kind="random", num_requests=60, isl=96, osl=48, rate=30,
                           ignore_eos=False),
    "all-at-once": WorkloadSpec(kind="random", num_requests=40, isl=64, osl=32),
    "shared-prefix": WorkloadSpec(kind="shared-prefix", num_requests=40, isl=32, osl=32,
                                  rate=40, system_prompt_len=128, num_prefixes=2),
    # follow-up turns queued among first turns still to come: the heap's order must hold
    "multi-turn": WorkloadSpec(kind="multi-turn", num_requests=12, isl=40, osl=24, turns=3),
    "structured": WorkloadSpec(kind="structured", num_requests=8, isl=32, osl=48, rate=20),
    "mix": WorkloadSpec(kind="mix", num_requests=30, isl=48, osl=32, rate=30,
                        mix=(("random", 0.5), ("multi-turn", 0.3), ("structured", 0.2)),
                        slo_class_mix=(("a", 0.5), ("b", 0.5))),
}


def _spec(name: str) -> WorkloadSpec:
    return dataclasses.replace(KINDS[name], vocab_size=get_tokenizer().vocab_size)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_lazy_workload_runs_as_the_list(name):
    spec = _spec(name)
    eager = virtual.run_virtual(build_core(H100), build_workload(spec))
    lazy_workload = stream_workload(spec)
    assert len(lazy_workload) == len(build_workload(spec))
    lazy = virtual.run_virtual(build_core(H100), lazy_workload)
    assert lazy.records == eager.records
    assert (lazy.duration_s, lazy.kv_usage_mean) == (eager.duration_s, eager.kv_usage_mean)


def test_a_workload_is_drawn_as_it_is_iterated_and_again_the_same(monkeypatch):
    drawn = [0]  # prompts drawn, one at a time (`_ids`) or a block at once (`_id_rows`)
    one, rows = workloads._ids, workloads._id_rows

    def count_one(*a):
        drawn[0] += 1
        return one(*a)

    def count_rows(rng, k, *a):
        drawn[0] += k
        return rows(rng, k, *a)

    monkeypatch.setattr(workloads, "_ids", count_one)
    monkeypatch.setattr(workloads, "_id_rows", count_rows)
    for lengths in ("uniform", "fixed"):  # drawn one by one, and in blocks
        drawn[0] = 0
        w = stream_workload(WorkloadSpec(kind="random", num_requests=1_000_000, isl=8, osl=8,
                                         rate=100, length_dist=lengths, length_spread=0.5))
        it = iter(w)
        first = [next(it) for _ in range(3)]
        # a million prompts were not drawn: three, or the one block holding them
        assert drawn[0] == (3 if lengths == "uniform" else workloads._BLOCK)
        assert len(w) == 1_000_000
        again = iter(w)
        assert [next(again) for _ in range(3)] == first
    assert not w.multi_turn and stream_workload(_spec("multi-turn")).multi_turn
    with pytest.raises(ValueError, match="num_prefixes"):  # bad arguments fail at once
        stream_workload(WorkloadSpec(kind="shared-prefix", num_prefixes=0))


def test_a_streamed_simulation_holds_only_the_sessions_in_flight(monkeypatch):
    held = [0]
    real = virtual._Runner._pull

    def pull(self):
        held[0] = max(held[0], len(self.sessions))
        return real(self)

    monkeypatch.setattr(virtual._Runner, "_pull", pull)
    spec = WorkloadSpec(kind="random", num_requests=400, isl=64, osl=64, rate=40,
                        ignore_eos=False)
    stream = SummaryStream(slo={"ttft": 0.05})
    streamed = simulate_streamed(H100, spec, stream)
    assert stream.records is None
    assert held[0] <= streamed["peak_running"] + 2 < 400 // 10
    listed, records = simulate_conversations(H100, spec)
    assert len(records) == 400
    goodput = streamed.pop("goodput")
    assert streamed.pop("slo") == {"ttft": 0.05}
    assert streamed == listed
    assert goodput["fraction"] == sum(r.ttft <= 0.05 for r in records) / 400


def test_a_fleet_run_summarised_as_it_goes_reports_what_its_records_give():
    """Pools, classes and replicas from the `FleetStream` sink of a lazy run: the numbers the
    listed run's records give, and no record kept."""
    fleet = [pool(SRAM, "sram", slo_classes=("interactive",)),
             pool(GPU, "gpu", replicas=2, slo_classes=("batch",))]
    spec = WorkloadSpec(kind="random", num_requests=60, isl=256, osl=32, rate=20.0, seed=1,
                        slo_class_mix=(("interactive", 0.3), ("batch", 0.7)),
                        vocab_size=get_tokenizer().vocab_size)
    listed = run_replicas(build_replicas(fleet), build_workload(spec), "slo-class")
    records = listed.run.records
    replicas = build_replicas(fleet)
    stream = FleetStream(pools_of(replicas), len(replicas))
    streamed = run_replicas(replicas, stream_workload(spec), "slo-class", records=stream)
    assert streamed.run.records is stream and stream.fleet.records is None
    assert stream.fleet.summary() == summarize(records)
    pools = stream.pool_reports(streamed.dispatch.cores)
    assert [p["requests"] for p in pools] == [
        sum(r.ok and r.replica in p.replicas for r in records) for p in pools_of(replicas)]
    assert pools[0]["ttft_s"] == summarize(
        [r for r in records if r.replica == 0])["ttft_s"]  # the SRAM pool: replica 0
    classes = stream.class_reports()
    assert sorted(classes) == ["batch", "interactive"]
    assert classes["interactive"]["requests"] == sum(r.slo_class == "interactive"
                                                     for r in records)
    assert [r["requests"] for r in replica_reports(streamed)] == [
        sum(r.ok and r.replica == k for r in records) for k in range(3)]
