"""The metrics hot path: request metrics are written once per engine step message, engine
metrics once per step — never a Prometheus call per token — with vLLM's interval semantics.

These drive the real front-end receiver and the real engine-side stats writer in-process
(no sockets are read: messages are handed to the receiver as its socket would)."""

from __future__ import annotations

import prometheus_client.metrics as prom_metrics
import pytest
import zmq

from server.engine.build import build_core
from server.engine.interface import EngineRequest
from server.engine.options import EngineOptions
from server.engine.request import Request, SamplingParams
from server.engine.tokenizer import get_tokenizer
from server.engine_proc.info import placed_info
from server.engine_proc.stats import EngineStats
from server.frontend.deployment import DeploymentClient
from server.frontend.receiver import Receiver
from server.frontend.stats import FrontendStats
from server.ipc import messages as m
from server.ipc.paths import RunDir
from server.stats import layout as stats_layout

OPTS = EngineOptions(name="d", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                     engine="vllm", max_model_len=512)


class Calls:
    """Counts calls into prometheus-client's metric objects and into our array writers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.prometheus = self.writes = 0
        for cls in (prom_metrics.Histogram, prom_metrics.Counter, prom_metrics.Gauge):
            for name in ("observe", "inc", "set", "labels"):
                if hasattr(cls, name):
                    monkeypatch.setattr(cls, name, self._count("prometheus", getattr(cls, name)))
        w = stats_layout.HistogramWriter
        for name in ("observe", "observe_many"):
            monkeypatch.setattr(w, name, self._count("writes", getattr(w, name)))

    def _count(self, field: str, fn):
        def counted(*args, **kwargs):
            setattr(self, field, getattr(self, field) + 1)
            return fn(*args, **kwargs)
        return counted


@pytest.fixture
def frontend(tmp_path):
    tok = get_tokenizer()
    core = build_core(OPTS, tok)
    info = placed_info(OPTS, 0, core, tok)
    run = RunDir(tmp_path)
    stats = FrontendStats(run.frontend_stats(0), [(0, 0)], 512)
    ctx = zmq.Context()
    client = DeploymentClient(0, [info], frontend=0, run_dir=run, ctx=ctx, tokenizer=tok,
                              stream_interval=1, clock=lambda: 0.0, stats=stats)
    yield Receiver(ctx.socket(zmq.PULL), [client], 0, stats), client, stats
    ctx.destroy(linger=0)


def streams(client: DeploymentClient, n: int) -> list[int]:
    from server.engine.output import RequestOutput
    from server.frontend.stream import RequestStream

    seqs = []
    for i in range(n):
        req = EngineRequest(f"r{i}", prompt_token_ids=(1, 2, 3))
        s = RequestStream(req, RequestOutput(req, (1, 2, 3), client.tokenizer), seq=i + 1,
                          deployment=0, rank=0, arrival=0.0, interval=1, clock=lambda: 0.0)
        client.streams[s.seq] = s
        seqs.append(s.seq)
    return seqs


def step(seqs: list[int], t0: float, t1: float, n: int = 1) -> m.StepOutputs:
    return m.StepOutputs(0, 0, 0, 1, t0, t1, seqs, [n] * len(seqs), [7] * (n * len(seqs)), [],
                         [], [])


@pytest.mark.parametrize("batch", [1, 8, 256])
def test_front_end_writes_per_step_not_per_token(frontend, monkeypatch, batch):
    receiver, client, _ = frontend
    seqs = streams(client, batch)
    receiver._dispatch(step(seqs, 0.0, 0.1))  # the first tokens
    calls = Calls(monkeypatch)
    for k in range(5):
        receiver._dispatch(step(seqs, 0.1 * (k + 1), 0.1 * (k + 2)))
    assert calls.prometheus == 0
    assert calls.writes == 5 * 3  # TTFT, ITL, fine ITL: three per step, whatever the batch


def test_intervals_follow_vllm(frontend):
    """TTFT from arrival at the first tokens; later steps record interval/n, n times (a step
    that brought n tokens, e.g. by jump-forward); prompt tokens counted at the first token."""
    receiver, client, stats = frontend
    (seq,) = streams(client, 1)
    receiver._dispatch(step([seq], 0.0, 0.5))
    receiver._dispatch(step([seq], 0.5, 0.6))
    receiver._dispatch(step([seq], 0.6, 1.0, n=4))
    lay, a = stats.layout, stats.file.values
    assert a[lay.slot("vllm:prompt_tokens")] == 3
    assert a[lay.slot("vllm:generation_tokens")] == 6
    base, sum_at = lay.hist("vllm:time_to_first_token_seconds")
    assert a[base:sum_at].sum() == 1 and a[sum_at] == pytest.approx(0.5)
    base, sum_at = lay.hist("vllm:inter_token_latency_seconds")
    assert a[base:sum_at].sum() == 5 and a[sum_at] == pytest.approx(0.1 + 4 * 0.1)


@pytest.mark.parametrize("batch", [1, 64])
def test_engine_writes_per_step_not_per_request(tmp_path, monkeypatch, batch):
    tok = get_tokenizer()
    core = build_core(OPTS, tok)
    stats = EngineStats(tmp_path / "e.stats", placed_info(OPTS, 0, core, tok), 0, 1)
    for i in range(batch):
        core.add_request(Request(f"r{i}", [1 + i, 2, 3], SamplingParams(max_tokens=50,
                                                                        ignore_eos=True)))
    core.step()
    calls = Calls(monkeypatch)
    for _ in range(5):
        stats.step(core, core.step(), 0.0, 1.0, 0, (0, 0, 0))
    assert calls.prometheus == 0
    assert calls.writes == 5 * 2  # iteration tokens and step seconds


def test_the_step_that_empties_the_deployment_writes_it_idle(tmp_path):
    """The lag gauge is the lag of running work: the step that finishes the last request
    writes 0 (and idle) in the same write as its tokens, so a client that has its last token
    and scrapes never finds the lag of a deployment that is already idle (CI's race: the scrape
    came before the engine loop's next turn wrote its idle stats)."""
    tok = get_tokenizer()
    core = build_core(OPTS, tok)
    stats = EngineStats(tmp_path / "e.stats", placed_info(OPTS, 0, core, tok), 0, 1)
    lag, idle = stats.slot("doppelchip_realtime_lag_seconds"), stats.slot("_idle")
    core.add_request(Request("r", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True)))
    seen = []
    while core.has_unfinished():
        stats.step(core, core.step(), 5.0, 1.0, 0, (0, 0, 0))
        seen.append((stats.a[lag], stats.a[idle]))
    assert seen[:-1] == [(5.0, 0)] * (len(seen) - 1) and len(seen) > 1
    assert seen[-1] == (0.0, 1)
