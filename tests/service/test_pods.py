"""One deployment per pod, as a vLLM pod runs behind a router: `serve --deployment`, served
model names, catalogue flags, data-parallel ranks, and `doppelchip pods`."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys

import grpc
import pytest
from fleets import TEST_FLEET
from server_proc import ROOT, ServerProcess, free_run, metric, toml_text

from clients.client import AsyncClient

ALIASES = ("meta-llama/Llama-3.1-8B-Instruct", "llama8b")


async def test_a_pod_serves_one_deployment_under_its_served_names():
    with ServerProcess(TEST_FLEET, "--deployment", "fast",
                       "--served-model-name", *ALIASES) as server:
        async with AsyncClient(server.target) as client:
            listing = await client.list_deployments()
            assert [d.name for d in listing.deployments] == ["fast"]
            assert listing.default_deployment == "fast"
            for model in ALIASES:
                chunks = [c async for c in client.generate("hi", model=model, max_tokens=2,
                                                           ignore_eos=True)]
                assert chunks[-1].final.deployment == "fast"
            with pytest.raises(grpc.aio.AioRpcError) as err:  # its names replace the id
                async for _ in client.generate("hi", model="llama-3.1-8b", max_tokens=2):
                    pass
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        text = await asyncio.to_thread(server.scrape)
    names = set(re.findall(r'^vllm:[^{]+\{[^}]*model_name="([^"]*)"', text, re.M))
    assert names == {ALIASES[0]}  # no vllm: series of a pod carries another model_name
    vllm_labels = {k for line in re.findall(r"^vllm:[^{]+\{([^}]*)\}", text, re.M)
                   for k in re.findall(r'(\w+)="', line)}
    assert {"model_name", "engine"} <= vllm_labels
    assert 'deployment="' not in text  # one deployment: the scraper's target says which
    assert re.search(r'^doppelchip_chips\{chip="h100-sxm"\} 1\.0$', text, re.M)
    assert metric(text, "vllm:request_success_total", finished_reason="length") == 2


async def test_catalogue_flags_and_data_parallel_ranks():
    flags = ["--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
             "--quant", "fp8", "--max-model-len", "512", "--data-parallel-size", "2",
             "--time-scale", "0.05"]
    with ServerProcess(None, *flags) as server:
        name = "vllm-h100-sxm-llama-3.1-8b-fp8"
        for rank in (0, 1):
            server.engine_pid(name, rank)
        async with AsyncClient(server.target) as client:
            listing = await client.list_deployments()
            assert [d.name for d in listing.deployments] == [name]
            await asyncio.gather(*(
                _drain(client.generate("dp", max_tokens=40, ignore_eos=True, seed=i))
                for i in range(8)))
        text = await asyncio.to_thread(server.scrape)
    per_rank = [metric(text, "vllm:request_success_total", engine=str(r),
                       finished_reason="length") for r in (0, 1)]
    assert sum(per_rank) == 8 and min(per_rank) >= 2  # both ranks took requests


async def _drain(stream) -> None:
    async for _ in stream:
        pass


def test_pod_flags_need_pod_mode():
    out = subprocess.run([sys.executable, "-m", "doppelchip.cli", "serve",
                          "--served-model-name", "x"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--served-model-name needs pod mode" in out.stderr


@pytest.mark.parametrize("flags, named", [
    (["--max-num-seqs", "8"], "--max-num-seqs"),  # the deployment group
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
     "--speculative-config"),
    (["--num-gpu-blocks-override", "64"], "--num-gpu-blocks-override"),  # dest kv_blocks
    (["--tp", "0"], "--tp"),  # a falsy value is still given
    (["--enable-sleep-mode"], "--enable-sleep-mode"),
    (["--fault-crash", "at=1"], "--fault-crash"),  # the failure-injection group
    (["--enable-lora", "--data-parallel-size", "2"], "--enable-lora, --data-parallel-size"),
])
def test_deployment_flags_without_pod_mode_are_refused_not_ignored(flags, named):
    """In fleet mode `serve` used to serve the fleet and ignore these: a user asking for
    --max-num-seqs 8 got the file's cap with no word. Each flag that shapes one deployment
    is refused there, by the name the user typed; pod mode takes it."""
    from doppelchip.cli import build_parser
    from doppelchip.cmd_serve import pod_fleet
    from server.config import load_fleet

    parser = build_parser("serve")
    with pytest.raises(ValueError, match=f"^{re.escape(named)} needs? pod mode"):
        pod_fleet(parser.parse_args(["serve", *flags]), load_fleet(None))
    server_level = parser.parse_args(["serve", "--stream-interval", "2", "--enable-scale-out"])
    assert pod_fleet(server_level, load_fleet(None)).deployments == load_fleet(None).deployments
    if "--tp" in flags:
        return  # (tp 0 is refused in pod mode too, for its own reason)
    pod = parser.parse_args(["serve", "--deployment", "vllm-h100", *flags])
    (deployment,) = pod_fleet(pod, load_fleet(None)).deployments
    assert deployment.name == "vllm-h100"


def test_pods_starts_one_pod_per_deployment(tmp_path):
    config = tmp_path / "fleet.toml"
    config.write_text(toml_text(TEST_FLEET))
    port = free_run(2)
    metrics_port = free_run(2, avoid=range(port - 1, port + 2))
    proc = subprocess.Popen(
        [sys.executable, "-m", "doppelchip.cli", "pods", "--config", str(config),
         "--port", str(port), "--http-port", str(metrics_port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline().split("\t") for _ in range(2)]
        assert [row[0] for row in lines] == ["fast", "slow"]

        async def check() -> None:
            for i, name in enumerate(("fast", "slow")):
                async with AsyncClient(f"127.0.0.1:{port + i}") as client:
                    listing = await client.list_deployments()
                    assert [d.name for d in listing.deployments] == [name]
        asyncio.run(check())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_a_pods_scrape_stays_under_50_kb():
    """The endpoint picker polls /metrics every 50 ms: a default catalogue pod (its real
    context length, so vLLM's token histograms have all their buckets) stays <= 50 KB once a
    router's traffic (completions, chat, a 400) and gRPC streams have filled its series —
    besides the family vLLM 0.34.0's API server added, `vllm:request_render_duration_seconds`
    (~4.4 KB with chat and completions rendered): a vLLM 0.34.0 pod's scrape grew by it too."""
    import httpx

    with ServerProcess(None, "--deployment", "vllm-h100", "--time-scale", "0.05") as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as h:
            assert (await h.post("/v1/completions", json={
                "prompt": "a", "max_tokens": 3})).status_code == 200
            assert (await h.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "b"}],
                "max_tokens": 3})).status_code == 200
            assert (await h.post("/v1/completions", json={
                "prompt": "c", "max_tokens": 0})).status_code == 400
        async with AsyncClient(server.target) as client:
            await asyncio.gather(*(_drain(client.generate(f"s{i}", max_tokens=20, seed=i))
                                   for i in range(16)))
        text = await asyncio.to_thread(server.scrape)
    assert metric(text, "vllm:request_success_total", finished_reason="length") >= 1
    assert 'handler="/v1/chat/completions"' in text  # the HTTP series are in it
    render = sum(len(line.encode()) + 1 for line in text.splitlines()
                 if "vllm:request_render_duration_seconds" in line)
    assert 4000 < render < 5000, render  # both request types' series, and no more
    assert len(text.encode()) - render <= 50_000, (len(text.encode()), render)
