"""smg in front of the ranks of one `vllm serve -dpm` pod (vLLM 0.34.0's multi-port
external load balancing, doppelchip/vllm_multiport.py): the gateway takes each rank's port as
an HTTP worker, as a router balancing over a wide expert-parallel pod's ranks does, and each
request lands on one rank, which counts it under its own `engine` label."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from gateway_harness import SMG, Gateway, start_smg, stop_group
from multiport_pod import MOE, MultiPortPod

pytestmark = pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")


def successes(port: int) -> dict[str, float]:
    """Each engine label's finished requests on the rank pod at `port`."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for m in re.finditer(r'^vllm:request_success_total\{([^}]*)\} (\S+)$', text, re.M):
        engine = re.search(r'engine="(\d+)"', m.group(1))
        if engine:
            out[engine.group(1)] = out.get(engine.group(1), 0.0) + float(m.group(2))
    return out


async def test_smg_balances_over_the_ranks_of_a_multi_port_pod(tmp_path):
    pod = MultiPortPod()
    proc = None
    try:
        await asyncio.to_thread(pod.wait_ready)
        urls = [f"http://127.0.0.1:{pod.port + i}" for i in (0, 1)]
        proc, port = start_smg(urls, tmp_path / "smg.log")
        gw = Gateway([], port, proc, tmp_path / "smg.log", urls, MOE)
        await gw.wait_ready(2, deadline_s=60)
        for i in range(4):
            status, body = await gw.call("POST", "/v1/completions", {
                "model": MOE, "prompt": f"request {i}", "max_tokens": 3, "ignore_eos": True},
                timeout=60)
            assert status == 200, body
            assert body["usage"]["completion_tokens"] == 3
        per_rank = [await asyncio.to_thread(successes, pod.port + i) for i in (0, 1)]
    finally:
        if proc is not None:
            await asyncio.to_thread(stop_group, proc)
        pod.stop()
    # each rank pod counts only its own rank, and round robin gave each two of the four
    assert per_rank == [{"0": 2.0}, {"1": 2.0}], per_rank
