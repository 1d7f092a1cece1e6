"""The process architecture: a crashed engine fails only its deployment and comes back, front
ends share the ports and the metrics, a port is never shared with another server, and real
time reports its own lag."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest
from fleets import TEST_FLEET, assert_released, fleet_doc
from server_proc import ROOT, ServerProcess, metric, toml_text, until

from clients.client import AsyncClient, build_request
from doppelchip.v1 import inference_pb2 as pb
from doppelchip.v1 import inference_pb2_grpc as pb_grpc

READY, FAILED = pb.DEPLOYMENT_STATE_READY, pb.DEPLOYMENT_STATE_FAILED


async def test_killed_engine_fails_only_its_deployment_and_comes_back():
    with ServerProcess(TEST_FLEET, "--engine-restart-backoff", "0.5") as server:
        pid = server.engine_pid("slow")
        async with AsyncClient(server.target) as client:
            call = client.stub.Generate(build_request(
                "doomed", deployment="slow", max_tokens=2000, ignore_eos=True))
            assert (await call.read()).token_ids
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "killed by SIGKILL" in err.value.details()
            failed = await until(client, "slow", lambda d: d.state == FAILED)
            assert "killed by SIGKILL" in failed.state_message
            assert "restarting in" in failed.state_message
            with pytest.raises(grpc.aio.AioRpcError) as err:  # meanwhile: a clear refusal
                async for _ in client.generate("x", deployment="slow", max_tokens=2):
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            # the rest of the fleet never noticed
            ok = [c async for c in client.generate("fine", deployment="fast", max_tokens=3,
                                                   ignore_eos=True)]
            assert ok[-1].final.usage.completion_tokens == 3
            # back after the back-off and its start-up, as a new process
            await until(client, "slow", lambda d: d.state == READY, timeout=60)
            assert server.engine_pid("slow", start=1) != pid or "restarting" in server.log
            again = [c async for c in client.generate("again", deployment="slow",
                                                      max_tokens=2, ignore_eos=True)]
            assert again[-1].final.usage.completion_tokens == 2
            await assert_released(client, "slow")
        text = await asyncio.to_thread(server.scrape)
        assert metric(text, "vllm:request_success_total", deployment="slow",
                      finished_reason="error") == 1
    assert "restarting the engine of slow rank 0 (epoch 1)" in server.log


async def test_outputs_equal_the_virtual_time_run():
    """The same requests through the real server's processes and through `run_virtual` on the
    same engine options: the same token ids, text, usage and finish reasons (the mock model
    is a function of the context, so batching and timing cannot change them)."""
    from clients.conversation import Conversation, Turn
    from server.config import parse_fleet
    from server.engine.build import build_core
    from server.engine.tokenizer import get_tokenizer
    from sim.virtual import run_virtual

    fast = {**TEST_FLEET["deployments"][0], "output_len_mean": 12.0}
    doc = fleet_doc(deployments=[fast])
    prompts = [tuple(range(20 + 7 * i, 40 + 7 * i)) for i in range(12)]
    with ServerProcess(doc) as server:
        async with AsyncClient(server.target) as client:
            async def one(i: int):
                chunks = [c async for c in client.generate(list(prompts[i]), max_tokens=40,
                                                           seed=i, request_id=f"v{i}")]
                return chunks
            results = await asyncio.gather(*(one(i) for i in range(12)))
        text = await asyncio.to_thread(server.scrape)
    options = parse_fleet(doc).deployments[0]
    tok = get_tokenizer()
    sessions = [Conversation(f"v{i}", 0.01 * i, (Turn(prompts[i], 40),),
                             ignore_eos=False, seed=i) for i in range(12)]
    records = {r.request_id: r for r in run_virtual(build_core(options, tok), sessions).records}
    total_out = 0
    for i, chunks in enumerate(results):
        ids = [t for c in chunks for t in c.token_ids]
        final = chunks[-1].final
        rec = records[f"v{i}"]
        assert len(ids) == rec.output_tokens == final.usage.completion_tokens
        assert final.usage.prompt_tokens == rec.prompt_tokens == len(prompts[i])
        assert pb.FinishReason.Name(final.finish_reason).lower().endswith(rec.finish_reason)
        assert "".join(c.text for c in chunks) == tok.decode(ids)
        total_out += len(ids)
    assert metric(text, "vllm:generation_tokens_total", deployment="fast") == total_out
    assert metric(text, "vllm:prompt_tokens_total", deployment="fast") == sum(map(len, prompts))


async def test_two_front_ends_share_the_port_and_one_metrics_view():
    """Both front-end processes answer on the one port (new connections until each has served
    some), and every scrape counts every front end's requests."""
    with ServerProcess(TEST_FLEET, "--api-server-count", "2") as server:
        served: dict[str, int] = {}
        options = [("grpc.use_local_subchannel_pool", 1)]  # a new connection per channel
        while len(served) < 2 or sum(served.values()) < 8:
            assert sum(served.values()) < 200, served
            async with grpc.aio.insecure_channel(server.target, options=options) as channel:
                call = pb_grpc.InferenceStub(channel).Generate(
                    build_request("hi", max_tokens=4, ignore_eos=True))
                frontend = dict(await call.initial_metadata())["x-doppelchip-frontend"]
                chunks = [c async for c in call]
                assert chunks[-1].final.usage.completion_tokens == 4
                served[frontend] = served.get(frontend, 0) + 1
        assert set(served) == {"0", "1"}
        n = sum(served.values())
        for _ in range(3):
            text = await asyncio.to_thread(server.scrape)
            assert metric(text, "vllm:request_success_total", deployment="fast",
                          finished_reason="length") == n
            assert metric(text, "vllm:generation_tokens_total", deployment="fast") == 4 * n


def test_a_port_is_never_shared_with_another_server(tmp_path):
    with ServerProcess(TEST_FLEET) as first:
        config = tmp_path / "fleet.toml"
        config.write_text(toml_text(TEST_FLEET))
        second = subprocess.run(
            [sys.executable, "-m", "doppelchip.cli", "serve", "--config", str(config),
             "--port", str(first.port), "--metrics-port", "0"],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1] == (
            f"error: gRPC port 127.0.0.1:{first.port} is already used by another doppelchip "
            "server")
    with socket.socket() as other:  # a port some other program listens on
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        taken = subprocess.run(
            [sys.executable, "-m", "doppelchip.cli", "serve", "--config", str(config),
             "--port", "0", "--http-port", str(port)],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert taken.returncode == 1
        assert taken.stderr.strip().splitlines()[-1] == (
            f"error: HTTP port 127.0.0.1:{port} is already in use")


async def test_lag_is_reported_when_the_host_cannot_keep_up():
    """At time scale 0.0001 an H100 step is under a microsecond of wall time: no host keeps
    up. The server says so in its log, the final chunk carries the delivery lag (emulated
    seconds: a millisecond of wall time is ten), and the lag gauge returns to 0 once the
    deployment is idle."""
    long = {**TEST_FLEET["deployments"][0], "max_model_len": 4096}
    with ServerProcess(fleet_doc({"time_scale": 0.0001}, [long])) as server:
        async with AsyncClient(server.target) as client:
            chunks = [c async for c in client.generate("lag", max_tokens=2000,
                                                       ignore_eos=True)]
            assert chunks[-1].final.timings.delivery_lag_s > 1.0
            await assert_released(client, "fast")
        server.wait_for_log(r"WARNING .*deployment fast is [\d.]+ ms \(wall\) behind its "
                            r"emulated timeline")
        text = await asyncio.to_thread(server.scrape)
        assert metric(text, "doppelchip_realtime_lag_seconds", deployment="fast") == 0.0


async def test_stream_interval_batches_tokens_into_messages():
    """vLLM's --stream-interval: every N tokens in one message (the first tokens and the end go
    at once; a consumer that falls behind gets more per message); the token times are the
    exact emulated times whatever the batching. True speed: ~6 ms between tokens."""
    async def run(*extra: str):
        with ServerProcess(fleet_doc({"time_scale": 1.0}), *extra) as server:
            async with AsyncClient(server.target) as client:
                return [c async for c in client.generate(
                    "interval", max_tokens=22, ignore_eos=True, return_token_times=True)]

    one, five = await run(), await run("--stream-interval", "5")
    counts = [len(c.token_ids) for c in five if c.token_ids]
    assert sum(counts) == 22 and all(n >= 5 for n in counts[1:-1]), counts
    assert len(counts) <= 1 + 22 // 5 + 1 < len([c for c in one if c.token_ids])
    times = lambda chunks: [t for c in chunks for t in c.token_times]  # noqa: E731
    assert times(one) == pytest.approx(times(five), rel=1e-9)


def test_a_killed_supervisor_takes_its_engines_and_front_ends_with_it():
    """SIGKILL leaves the supervisor no time to stop anyone: every engine and front end
    notices through its lifeline and exits, freeing the ports (no orphans)."""
    with ServerProcess(TEST_FLEET) as server:
        pids = [server.engine_pid("fast"), server.engine_pid("slow")]
        server.wait_for_log(r"front end 0 up: pid \d+")  # all are up before "listening"
        pids += [int(p) for p in re.findall(r"front end \d+ up: pid (\d+)", server.log)]
        port = server.port
        server.signal(signal.SIGKILL)
        server.proc.wait(10)

        def alive() -> list[int]:
            out = []
            for pid in pids:
                try:  # (reaped between any two calls here: gone)
                    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except (FileNotFoundError, ProcessLookupError):
                    continue
                if state != "Z":
                    out.append(pid)
            return out

        def port_free() -> bool:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    return False
                return True

        # a process's leader shows Z while its other threads still exit (and hold its
        # sockets): gone means no live pid *and* the gRPC port free again
        deadline = time.monotonic() + 10
        while alive() or not port_free():
            assert time.monotonic() < deadline, f"still running: {alive()}, port {port}"
            time.sleep(0.05)  # polling for exits; no other event reaches this process
