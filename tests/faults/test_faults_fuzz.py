"""A property-based fuzzer over both gRPC services (doppelchip.v1.Inference and
vllm.grpc.engine.VllmEngine) and the HTTP API, against one real server (issue 14).

Properties, over 2,400 cases (50 examples of 48 concurrent cases, derandomized so CI is
deterministic): every answer is a documented status (`documented.py`) that a serving server
may give, no read ever hangs; afterwards the server's log holds no traceback and no error, and
the deployment is idle — no request running or waiting and every KV block free (the status
query and /metrics agree), the engines' `--check-integrity` found nothing (a broken invariant
would have crashed an engine: its deployment FAILED), and every pooled request id is free
again on every deployment (nothing left in flight in a front end).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fuzz_env import Clients, LoopThread, run_batch, run_batches
from fuzz_strategies import DEPLOYMENTS, EMBED_MODEL, ID_POOL, RERANK_MODEL, case
from server_proc import ServerProcess, metric, released

from clients.client import AsyncClient

BATCH = 48
EXAMPLES = 50
LIMITS = {"max_model_len": 256, "max_prompt_bytes": 100_000}
FUZZ_FLEET = {
    "server": {"time_scale": 0.05, "default_deployment": "fast", "drain_grace_s": 5.0,
               "vllm_engine_deployment": "tiny"},
    "deployments": [
        {"name": "fast", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", **LIMITS},
        # a small queue, so concurrent cases also meet admission control (HTTP: its model)
        {"name": "tiny", "model": "llama-3-8b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "sglang", "max_num_seqs": 2, "max_waiting": 3, **LIMITS},
        # an embedding model: the pooling routes are mounted and fuzzed (docs/EMBEDDINGS.md)
        {"name": "embed", "model": EMBED_MODEL, "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", **LIMITS},
        # a cross-encoder: /classify, and /score and /rerank one prompt per pair through its
        # template (its kwargs fuzzed too)
        {"name": "rerank", "model": RERANK_MODEL, "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "hf_overrides": '{"architectures": '
         '["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], '
         '"method": "from_2_way_softmax"}',
         "chat_template": "<q>{{ messages[0].content }}</q>{{ instruction }}"
                          "<d>{{ messages[1].content }}</d>", **LIMITS},
    ],
}


@pytest.fixture(scope="module")
def fuzz_server():
    with ServerProcess(FUZZ_FLEET, "--enable-scale-out") as s:  # its routes fuzzed too
        yield s


@pytest.fixture(scope="module")
def runner(fuzz_server):
    loop = LoopThread()

    async def make() -> Clients:
        return Clients(fuzz_server.target, fuzz_server.http_url)

    clients = loop.run(make())
    yield loop, clients
    loop.run(clients.close())
    loop.stop()


def test_fuzz_answers_only_documented_statuses_and_leaves_nothing_behind(fuzz_server, runner):
    loop, clients = runner
    ran = run_batches(loop, lambda cases: run_batch(clients, cases), case(), EXAMPLES, BATCH)
    assert ran >= 2000
    loop.run(assert_idle(fuzz_server))
    assert not (errors := log_errors(fuzz_server.log)), "\n".join(errors)


def log_errors(log: str) -> list[str]:
    """Every ERROR line and traceback of the server's log, each line cut to 300 chars."""
    lines = log.splitlines()
    out = []
    for i, line in enumerate(lines):
        if " ERROR " in line or line.startswith("Traceback"):
            out += [x[:300] for x in lines[i:i + 12]] + ["---"]
    return out


async def assert_idle(server: ServerProcess) -> None:
    async with AsyncClient(server.target) as client:
        for name in DEPLOYMENTS:
            await released(client, name, timeout=30)
        text = await asyncio.to_thread(server.scrape)
        for name in DEPLOYMENTS:
            labels = {"deployment": name, "engine": "0"}
            assert metric(text, "vllm:num_requests_running", **labels) == 0
            assert metric(text, "vllm:num_requests_waiting", **labels) == 0
            assert metric(text, "vllm:kv_cache_usage_perc", **labels) == 0
            if name in ("embed", "rerank"):  # (they generate nothing: ids checked over HTTP)
                continue
            for rid in ID_POOL:  # no front end still holds a pooled id in flight
                chunks = [c async for c in client.generate(
                    "again", deployment=name, request_id=rid, max_tokens=1)]
                assert chunks[-1].final.usage.completion_tokens == 1
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        for rid in ID_POOL:
            r = await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": "again"},
                                headers={"X-Request-Id": rid})
            assert r.status_code == 200, r.text
            r = await http.post("/rerank", json={"model": RERANK_MODEL, "query": "a",
                                                 "documents": ["b", "c"]},
                                headers={"X-Request-Id": rid})
            assert r.status_code == 200, r.text
