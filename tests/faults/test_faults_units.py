"""Fault specs, schedules and the request-level draw, without a server: parsing errors are
clear, schedules are pure functions of (spec, seed), a restart skips what happened before it,
lost chips take their share of the pool by preemption and give every block back, and a
slowdown multiplies the step's device time."""

from __future__ import annotations

import itertools
import tomllib

import pytest

from server.config import ConfigError, parse_fleet
from server.engine.build import build_core
from server.engine.faults import Schedule, check_options, parse_spec, windows
from server.engine.interface import SamplingParams
from server.engine.options import EngineOptions
from server.engine.request import Request
from server.frontend.faults import KINDS, InjectedFailure, RequestFaults
from server.frontend.stats import FrontendStats
from server.http.errors import from_engine


@pytest.mark.parametrize(("kind", "text", "message"), [
    ("slowdown", "at=10,for=5", "missing factor"),
    ("slowdown", "at=10,for=5,factor=1", "factor must be > 1"),
    ("hang", "for=5", "exactly one of at= or rate="),
    ("hang", "at=1,rate=2,for=5", "exactly one of at= or rate="),
    ("crash", "at=x", "at must be a number"),
    ("crash", "at=5,speed=2", "unknown key(s) speed"),
    ("lost_chips", "at=5,chips=1.5", "chips must be a whole number"),
    ("stream_cut", "at=5,after=3", "missing for"),
    ("stream_cut", "percent=120,after=3", "percent must be in [0, 100]"),
])
def test_bad_specs_say_what_is_wrong(kind, text, message):
    with pytest.raises(ValueError, match=None) as err:
        parse_spec(kind, text)
    assert message in str(err.value)


def test_fleet_file_rejects_bad_fault_options():
    base = ('[[deployments]]\nname = "a"\nmodel = "llama-3.1-8b"\nquant = "bf16"\n'
            'chip = "h100-sxm"\nengine = "vllm"\n')
    fleet = parse_fleet(tomllib.loads(base + 'failure_injection_rate = 12.5\n'
                                      'failure_types = ["rate_limit", "server_error"]\n'
                                      'fault_hang = ["at=30,for=5"]\n'))
    assert fleet.deployments[0].failure_types == ("rate_limit", "server_error")
    for extra, message in (('failure_injection_rate = 101\n', "[0, 100]"),
                           ('failure_types = ["rate-limit"]\n', "invalid failure type"),
                           ('fault_crash = ["when=3"]\n', "unknown key(s) when")):
        with pytest.raises(ConfigError, match=None) as err:
            parse_fleet(tomllib.loads(base + extra))
        assert message in str(err.value)


def test_random_occurrences_are_a_function_of_the_seed():
    spec = parse_spec("slowdown", "rate=0.1,for=2,factor=3")
    first = [w.start for _, w in zip(range(20), windows(spec, 7, 0), strict=False)]
    again = [w.start for _, w in zip(range(20), windows(spec, 7, 0), strict=False)]
    other = [w.start for _, w in zip(range(20), windows(spec, 8, 0), strict=False)]
    assert first == again and first != other
    assert all(b >= a + 2 for a, b in itertools.pairwise(first))  # no overlap
    mean_gap = (first[-1] - first[0]) / 19 - 2
    assert 2 < mean_gap < 50  # 1 / rate = 10 s between occurrences, roughly


def test_a_restart_skips_what_happened_before_it():
    specs = {"crash": (parse_spec("crash", "at=10"), parse_spec("crash", "at=50")),
             "hang": (parse_spec("hang", "at=20,for=30"),)}
    s = Schedule(specs, seed=0)
    running = s.arm(30.0)  # the engine became ready at t=30 (after the crash at 10)
    assert [(w.kind, w.start, w.end) for w in running] == [("hang", 30.0, 50.0)]
    assert s.next_start() == 50.0
    assert [w.kind for w in s.due(49.9)] == []
    assert [(w.kind, w.start) for w in s.due(50.0)] == [("crash", 50.0)]
    assert s.next_start() is None


def _faults(**options) -> RequestFaults:
    opts = EngineOptions(name="d", model="m", quant="bf16", chip="h100-sxm", engine="vllm",
                         **options)
    check_options(opts)
    import tempfile
    from pathlib import Path
    path = Path(tempfile.mkdtemp()) / "f.stats"
    return RequestFaults(opts, 0, "llama-3.1-8b",
                           FrontendStats(path, [(0, 0)], 256, faults=True), (0, 0))


def test_the_draw_is_deterministic_under_the_seed_and_counted():
    a = _faults(failure_injection_rate=40.0, failure_injection_seed=3)
    b = _faults(failure_injection_rate=40.0, failure_injection_seed=3)
    c = _faults(failure_injection_rate=40.0, seed=3)  # the deployment's seed by default
    d = _faults(failure_injection_rate=40.0, failure_injection_seed=4)
    seq = [a.draw(k) for k in range(400)]
    assert seq == [b.draw(k) for k in range(400)] == [c.draw(k) for k in range(400)]
    assert seq != [d.draw(k) for k in range(400)]
    assert set(seq) == {None, *KINDS}  # no types given: all six
    for k, expected in enumerate(seq[:50]):
        try:
            assert a.admit() == k and expected is None
        except InjectedFailure as e:
            assert e.failure_type == expected
    layout = a._stats.layout
    counted = {t: a._row[layout.slot("doppelchip_failure_injections", t)] for t in KINDS}
    assert sum(counted.values()) == sum(x is not None for x in seq[:50])
    only = _faults(failure_injection_rate=100.0, failure_types=("model_not_found",))
    assert {only.draw(k) for k in range(50)} == {"model_not_found"}
    assert {_faults(failure_injection_rate=0.0).draw(k) for k in range(50)} == {None}


def test_injected_errors_answer_as_llm_d_inference_sim():
    body = from_engine(InjectedFailure("rate_limit", "llama-3.1-8b")).body()["error"]
    assert body == {"message": "Rate limit reached for llama-3.1-8b in organization org-xxx on "
                               "requests per min (RPM): Limit 3, Used 3, Requested 1.",
                    "type": "RateLimitError", "param": None, "code": 429}
    body = from_engine(InjectedFailure("model_not_found", "m")).body()["error"]
    assert (body["code"], body["type"], body["param"]) == (404, "NotFoundError", "model")
    assert body["message"] == "The model 'm-nonexistent' does not exist"
    from server.convert import status_code
    codes = {t: status_code(InjectedFailure(t, "m")).name for t in KINDS}
    assert codes == {"rate_limit": "RESOURCE_EXHAUSTED", "invalid_api_key": "UNAUTHENTICATED",
                     "context_length": "INVALID_ARGUMENT", "server_error": "UNAVAILABLE",
                     "invalid_request": "INVALID_ARGUMENT", "model_not_found": "NOT_FOUND"}


class _Stats:
    """The slice of EngineStats the fault driver writes."""

    def __init__(self) -> None:
        from server.stats.layout import Layout
        from server.stats.schema_features import FAULT_ENGINE_METRICS
        self.layout = Layout(list(FAULT_ENGINE_METRICS))
        self.a = [0.0] * self.layout.size
        self.slot = self.layout.slot
        self.file = self

    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass


def test_lost_chips_preempt_to_take_their_share_and_give_every_block_back():
    from server.engine_proc.faults import FaultDriver, schedule_of

    # 16-token blocks (vLLM 0.34.0's default is 64): the three 200-token prompts hold 39 of
    # the 40, more than the half the lost chip leaves
    opts = EngineOptions(name="d", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                         engine="vllm", tp=2, kv_blocks=40, block_size=16, max_model_len=512,
                         fault_lost_chips=("at=10,chips=1,for=5",))
    core = build_core(opts)
    sched = core.scheduler
    for i in range(3):
        core.add_request(Request(f"r{i}", list(range(100 * i + 1, 100 * i + 201)),
                                 SamplingParams(max_tokens=40, ignore_eos=True).resolved(40)))
    assert core.step() is not None and sched.num_running == 3
    used = sched.pool.num_used
    assert used > 20  # more than the half the pool keeps
    stats = _Stats()
    driver = FaultDriver(schedule_of(opts), core, stats, 1.0, "d")
    driver.start(0.0)
    seen, rebalance = [], driver._rebalance

    def watched() -> None:  # a scrape while the pool shrinks (preempting takes a while)
        seen.append((stats.a[stats.slot("doppelchip_fault_events", "lost_chips")],
                     stats.a[stats.slot("doppelchip_fault_active", "lost_chips")]))
        rebalance()

    driver._rebalance = watched
    driver.advance(10.0)
    assert len(driver.held) == 20 and stats.a[stats.slot("doppelchip_kv_lost_blocks")] == 20
    # counted and active in one update: never an event counted while its fault shows inactive
    assert seen == [(0.0, 0.0)]
    assert stats.a[stats.slot("doppelchip_fault_events", "lost_chips")] == 1
    assert stats.a[stats.slot("doppelchip_fault_active", "lost_chips")] == 1
    assert sched.stats.num_preemptions >= 1 and driver.take_preempted()
    assert sched.pool.num_free + sched.cache.evictable_blocks <= 20
    while core.has_unfinished():  # the survivors finish in the smaller pool
        core.step()
    driver.advance(15.0)
    assert driver.held == [] and stats.a[stats.slot("doppelchip_fault_active", "lost_chips")] == 0
    sched.check_integrity()
    assert sched.pool.num_free + sched.cache.evictable_blocks == 40


def test_slowdown_multiplies_the_device_time():
    from server.engine_proc.faults import FaultDriver, schedule_of

    opts = EngineOptions(name="d", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                         engine="vllm", fault_slowdown=("at=5,for=5,factor=3",))
    core = build_core(opts)
    core.add_request(Request("r", list(range(1, 50)),
                             SamplingParams(max_tokens=5, ignore_eos=True).resolved(5)))
    result = core.step()
    driver = FaultDriver(schedule_of(opts), core, _Stats(), 1.0, "d")
    driver.start(0.0)
    assert driver.slow(result, 1.0).seconds == result.seconds
    driver.advance(5.0)
    assert driver.slow(result, 6.0).seconds == pytest.approx(3 * result.seconds)
    driver.advance(10.0)
    assert driver.slow(result, 10.0).seconds == result.seconds


def test_flags_reach_a_pod_and_virtual_time_refuses_them(capsys):
    import argparse

    from doppelchip.cli import main
    from doppelchip.cmd_serve import pod_fleet, register
    from server.config import load_fleet

    base = ["--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
            "--quant", "bf16"]
    flags = ["--failure-injection-rate", "5", "--failure-types", "rate_limit",
             "--fault-crash", "at=50", "rate=0.01", "--fault-stream-cut", "after=2,percent=1"]
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["serve", *base, *flags])
    (opts,) = pod_fleet(args, load_fleet(None)).deployments
    assert (opts.failure_injection_rate, opts.failure_types) == (5.0, ("rate_limit",))
    assert opts.fault_crash == ("at=50", "rate=0.01")
    assert opts.fault_stream_cut == ("after=2,percent=1",)
    assert main(["simulate", *base, *flags, "--num-requests", "2"]) == 2
    assert "failure injection runs in `doppelchip serve`" in capsys.readouterr().err
