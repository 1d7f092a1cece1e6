"""Which data-parallel rank a front end sends a request to: vLLM 0.33.0's score
(DPLBAsyncMPClient) — running + waiting, waiting requests weighing more as a rank's KV cache
fills past half, since a queue on a KV-bound rank drains slowly — read from the ranks' stats
files; ties go round robin."""

from __future__ import annotations

import pytest
import zmq

from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from server.engine_proc.info import placed_info
from server.frontend.deployment import DeploymentClient
from server.frontend.stats import FrontendStats
from server.ipc.paths import RunDir
from server.stats.layout import Layout
from server.stats.schema import STATE_CODES, engine_metrics
from server.stats.shm import StatsFile

OPTS = EngineOptions(name="d", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                     engine="vllm", max_model_len=4096, data_parallel_size=2)


@pytest.fixture
def two_ranks(tmp_path):
    tok = get_tokenizer()
    core = build_core(OPTS, tok)
    infos = [placed_info(OPTS, r, core, tok) for r in (0, 1)]
    run = RunDir(tmp_path)
    files = []
    for info in infos:
        layout = Layout(engine_metrics(info))
        f = StatsFile(run.engine_stats(0, info.rank), layout.size, create=True)
        files.append((f, layout))
    ctx = zmq.Context()
    stats = FrontendStats(run.frontend_stats(0), [(0, 0), (0, 1)], 4096)
    client = DeploymentClient(0, infos, frontend=0, run_dir=run, ctx=ctx, tokenizer=tok,
                              stream_interval=1, clock=lambda: 0.0, stats=stats)

    def load(rank: int, running: int, waiting: int, kv_usage: float) -> None:
        f, layout = files[rank]
        f.begin()
        f.values[layout.slot("_state")] = STATE_CODES.index("ready")
        f.values[layout.slot("vllm:num_requests_running")] = running
        f.values[layout.slot("vllm:num_requests_waiting")] = waiting
        f.values[layout.slot("_kv_used")] = kv_usage * infos[rank].capacity.kv_blocks_total
        f.end()

    yield client, load
    ctx.destroy(linger=0)


def test_a_queue_on_a_full_kv_cache_weighs_more_than_running_requests(two_ranks):
    client, load = two_ranks
    load(0, running=0, waiting=2, kv_usage=0.9)  # 2 + 2 × 6 × 0.4 = 6.8
    load(1, running=3, waiting=0, kv_usage=0.2)  # 3
    assert client._pick_rank()[0] == 1
    load(0, running=0, waiting=2, kv_usage=0.4)  # below half: no penalty, 2 < 3
    assert client._pick_rank()[0] == 0


def test_equal_loads_go_round_robin(two_ranks):
    client, load = two_ranks
    load(0, running=1, waiting=0, kv_usage=0.1)
    load(1, running=1, waiting=0, kv_usage=0.1)
    assert {client._pick_rank()[0] for _ in range(4)} == {0, 1}
