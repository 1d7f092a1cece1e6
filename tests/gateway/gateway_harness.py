"""The smg gateway in front of doppelchip replicas, for the end-to-end tests.

Each replica is a real `doppelchip serve` (the test fleet, its VllmEngine service fronting one
deployment) on an ephemeral loopback port; smg runs as a subprocess bound to
127.0.0.1 (HTTP and Prometheus), pointed at the replicas with grpc:// URLs, and is always
killed on the way out. HTTP calls are blocking stdlib calls run in a thread, so the replicas
keep serving meanwhile. Every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleets import fleet_doc
from server_proc import ServerProcess

SMG = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
MODEL = "llama-3.1-8b"  # the served model name of the test fleet's "fast"
# smg looks a tokenizer up on the Hugging Face hub before asking the worker (GetTokenizer):
# its hub client is pointed at a closed loopback port, so no test reaches the network
OFFLINE = {"NO_COLOR": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None,
         timeout: float = 10.0) -> tuple[int, Any]:
    """Status and decoded JSON body (or text) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def sse(url: str, body: dict, timeout: float = 10.0, max_events: int | None = None
        ) -> tuple[int, list[dict]]:
    """A streaming request's status and its `data:` events (JSON), up to `[DONE]`, or the
    first `max_events` (then the connection is closed: a client that goes away)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    events: list[dict] = []
    try:
        r = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        return e.code, [json.loads(e.read() or b"{}")]
    with r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            events.append(json.loads(payload))
            if max_events is not None and len(events) >= max_events:
                break
        return r.status, events


@dataclass
class Gateway:
    replicas: list[ServerProcess]
    port: int
    proc: subprocess.Popen
    log: Path
    urls: list[str] = field(default_factory=list)

    model: str = "llama-3.1-8b"  # the served model name (the fronted deployment's model)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def call(self, method: str, path: str, body: dict | None = None,
                   timeout: float = 10.0) -> tuple[int, Any]:
        return await asyncio.to_thread(http, method, self.base + path, body, timeout)

    async def stream(self, path: str, body: dict, timeout: float = 10.0,
                     max_events: int | None = None) -> tuple[int, list[dict]]:
        return await asyncio.to_thread(sse, self.base + path, body, timeout, max_events)

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    async def wait_ready(self, n: int, deadline_s: float = 30.0) -> None:
        """Until smg is ready with `n` healthy workers (registered, tokenizer loaded)."""
        end = time.monotonic() + deadline_s
        body: Any = None
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited ({self.proc.returncode}):\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                status, body = await self.call("GET", "/readiness", timeout=2.0)
                if status == 200 and body.get("healthy_workers", 0) >= n:
                    return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"smg not ready with {n} workers in {deadline_s}s: {body}\n"
                           f"{self.log_tail()}")


def gateway_fleet(deployments: list[dict] | None = None, **server: Any) -> dict:
    """The test fleet (or the given deployments), its VllmEngine fronting `fast` (or the
    first deployment) unless told."""
    if deployments is None:
        return fleet_doc({"vllm_engine_deployment": "fast", **server})
    return fleet_doc({"vllm_engine_deployment": deployments[0]["name"], **server}, deployments)


def start_smg(worker_urls: list[str], log: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [SMG, "launch", "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
           "--worker-urls", *worker_urls, "--policy", "round_robin",
           "--shutdown-grace-period-secs", "1", "--log-level", "info", *extra]
    out = log.open("wb")
    env = {**os.environ, **OFFLINE}
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    out.close()
    return proc, port


def stop_group(proc: subprocess.Popen, timeout: float = 5.0) -> int:
    """SIGTERM to a process started in its own session (smg, a launcher and its children),
    SIGKILL if it is not gone within `timeout`; its exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    return proc.returncode


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, fleets: list[dict], *smg_args: str, wait: bool = True
                  ) -> AsyncIterator[Gateway]:
    """Replicas (one server per fleet document) behind one smg; everything stopped on the
    way out."""
    fronted = fleets[0]["server"]["vllm_engine_deployment"]
    model = next(d["model"] for d in fleets[0]["deployments"] if d["name"] == fronted)
    async with gateway_over(tmp_path, [ServerProcess(f) for f in fleets],
                            lambda r: f"grpc://{r.target}", model, *smg_args,
                            wait=wait) as gw:
        yield gw


@contextlib.asynccontextmanager
async def gateway_over(tmp_path: Path, replicas: list[ServerProcess], url, model: str,
                       *smg_args: str, wait: bool = True) -> AsyncIterator[Gateway]:
    """`replicas` (not started yet) behind one smg, each given to it as `url(replica)`;
    everything stopped on the way out."""
    proc = None
    try:
        for r in replicas:
            await asyncio.to_thread(r.start)
        urls = [url(r) for r in replicas]
        proc, port = start_smg(urls, tmp_path / "smg.log", *smg_args)
        gw = Gateway(replicas, port, proc, tmp_path / "smg.log", urls, model)
        if wait:
            await gw.wait_ready(len(replicas))
        yield gw
    finally:
        if proc is not None:
            await asyncio.to_thread(stop_group, proc)
        for r in replicas:
            await asyncio.to_thread(r.stop)


async def wait_for(cond, deadline_s: float = 10.0) -> None:
    """Until cond() holds (polling the loop), or fail after the deadline."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not cond():
        assert loop.time() < end, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def check_cache_aware_chat(gw: Gateway, model: str = MODEL) -> None:
    """Through smg with `cache_aware` over two gRPC workers: the same chat request three times
    (6 tokens each) reads cached tokens 0, then > 0 twice (the pod that holds the prompt), and
    a streamed `n` = 2 request gives two outputs, the first the same text, 12 tokens in all."""
    prompt = "A long shared system prompt. " * 40
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 6, "ignore_eos": True, "seed": 3}
    cached = []
    for _ in range(3):
        status, out = await gw.call("POST", "/v1/chat/completions", body)
        assert status == 200, out
        assert out["usage"]["completion_tokens"] == 6
        assert out["choices"][0]["finish_reason"] == "length"
        cached.append((out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # the pod that holds it
    status, events = await gw.stream("/v1/chat/completions", {
        **body, "stream": True, "n": 2, "stream_options": {"include_usage": True}})
    assert status == 200
    texts = {i: "".join(c["delta"].get("content") or "" for e in events
                        for c in e["choices"] if c["index"] == i) for i in (0, 1)}
    assert texts[0] == out["choices"][0]["message"]["content"] and texts[1]
    assert events[-1]["usage"]["completion_tokens"] == 12  # n = 2 outputs of 6
