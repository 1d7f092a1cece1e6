"""A real `doppelchip serve` in its own process tree, on ephemeral loopback ports, for tests.

The served path is the multi-process one (supervisor, engine-core processes, front ends), so
service tests talk to it only as clients do: gRPC, HTTP (the OpenAI API and `/metrics` share
`http_port`), signals, and its log. Engines
run with `--check-integrity` (they check their KV pool and queues each time they go idle): a
broken invariant crashes the engine, which then shows as a FAILED deployment. `released()` is
the status query that proves a deployment holds no request and no KV block.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def toml_text(doc: dict[str, Any]) -> str:
    """A fleet document ({"server": {...}, "deployments": [...]}) as TOML."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, dict):  # an inline table
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return repr(v)

    lines = ["[server]"] + [f"{k} = {value(v)}" for k, v in doc.get("server", {}).items()]
    for d in doc.get("deployments", []):
        lines += ["", "[[deployments]]"] + [f"{k} = {value(v)}" for k, v in d.items()]
    return "\n".join(lines) + "\n"


class ServerProcess:
    def __init__(self, doc: dict[str, Any] | None = None, *extra: str,
                 check_integrity: bool = True, env: dict[str, str] | None = None,
                 vllm: bool = False) -> None:
        """`vllm`: start `doppelchip vllm serve` (vLLM's command line) with `extra` instead."""
        self.doc, self.extra, self.env, self.vllm = doc, list(extra), env or {}, vllm
        self.check_integrity = check_integrity
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None
        self.port = self.http_port = 0
        self._dir = tempfile.TemporaryDirectory(prefix="doppelchip-test-")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        cmd = [sys.executable, "-m", "doppelchip.cli", "serve", "--log-level", "info"]
        if self.vllm:
            cmd = [sys.executable, "-m", "doppelchip.cli", "vllm", "serve", "--port", "0"]
            if "--grpc" not in self.extra:  # (vLLM's --grpc serves gRPC on --port)
                cmd += ["--grpc-port", "0"]
        elif self.doc is not None:
            path = Path(self._dir.name) / "fleet.toml"
            path.write_text(toml_text(self.doc))
            cmd += ["--config", str(path)]
        if not self.vllm and not any(a.startswith("--port") for a in self.extra):
            cmd += ["--port", "0", "--http-port", "0"]
        if self.check_integrity:
            cmd.append("--check-integrity")
        self.proc = subprocess.Popen(cmd + self.extra, cwd=ROOT, stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        threading.Thread(target=self._read, daemon=True).start()
        pattern = (r"listening on 127\.0\.0\.1:(\d+) \((?:HTTP and )?metrics on "
                   r"127\.0\.0\.1:(\d+)\)")
        found = re.search(pattern, self.wait_for_log(pattern, timeout))
        assert found is not None
        self.port, self.http_port = int(found.group(1)), int(found.group(2))
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<eof>")
            self._cond.notify_all()

    @property
    def log(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for_log(self, pattern: str, timeout: float = 30.0, start: int = 0) -> str:
        """The first log line (from index `start`) matching `pattern`; fails at the timeout
        or when the server's stderr ends first."""
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    if regex.search(self.lines[i]):
                        return self.lines[i]
                    if self.lines[i] == "<eof>":
                        raise AssertionError(f"server exited before {pattern!r}:\n{self.log}")
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} in the server log:\n{self.log}")
                self._cond.wait(left)

    def engine_pid(self, deployment: str, rank: int = 0, start: int = 0) -> int:
        line = self.wait_for_log(rf"engine core of {re.escape(deployment)} \(rank {rank}\) up: "
                                 r"pid \d+", start=start)
        return int(line.rsplit(" ", 1)[1])

    @property
    def metrics_port(self) -> int:
        """/metrics is served on the HTTP port."""
        return self.http_port

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait, return the exit status (kill at the timeout)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._dir.cleanup()
        return code

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TrtllmServe(ServerProcess):
    """`doppelchip trtllm-serve ARGV` (TensorRT-LLM's command line, either mode) in its own
    process, ready when its pod listens: `port` is the pod's gRPC port, `http_port` its HTTP
    port, whichever trtllm-serve's --port named."""

    def start(self, timeout: float = 60.0) -> TrtllmServe:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "doppelchip.cli", "trtllm-serve", *self.extra], cwd=ROOT,
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        threading.Thread(target=self._read, daemon=True).start()
        pattern = r"listening on 127\.0\.0\.1:(\d+) \(HTTP and metrics on 127\.0\.0\.1:(\d+)\)"
        found = re.search(pattern, self.wait_for_log(pattern, timeout))
        assert found is not None
        self.port, self.http_port = int(found.group(1)), int(found.group(2))
        return self


async def released(client, name: str, timeout: float = 10.0) -> Any:
    """Wait until deployment `name` holds no request and every KV block is free (or held only
    by the prefix cache); return its status. Fails if it does not get there in time or if its
    engine crashed on a broken invariant (the deployment turns FAILED)."""
    from doppelchip.v1 import inference_pb2 as pb

    deadline = time.monotonic() + timeout
    while True:
        d = await client.get_deployment(name)
        assert d.state != pb.DEPLOYMENT_STATE_FAILED, d.state_message
        idle = d.load.num_running == 0 and d.load.num_waiting == 0
        if idle and d.capacity.kv_blocks_free == d.capacity.kv_blocks_total:
            return d
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} still holds work: {d.load} {d.capacity}")
        await asyncio.sleep(0.02)


async def until(client, name: str, predicate, timeout: float = 10.0) -> Any:
    """Wait until `predicate(deployment status)` holds for deployment `name`; return the
    status (a status query: the engine's state lives in another process)."""
    deadline = time.monotonic() + timeout
    while not predicate(d := await client.get_deployment(name)):
        assert time.monotonic() < deadline, f"{name}: condition not met: {d}"
        await asyncio.sleep(0.02)
    return d


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the one sample `name` whose labels include `labels` in a /metrics text."""
    found = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        body, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in body for k, v in labels.items()):
            found.append(float(value))
    assert len(found) == 1, f"{name} {labels}: {len(found)} samples"
    return found[0]


def free_run(n: int, avoid: range | None = None) -> int:
    """A port p with p .. p+n-1 all free on 127.0.0.1 (commands that count ports up)."""
    import socket

    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535 or (avoid is not None and (base in avoid or base + n - 1 in avoid)):
            continue
        probes = []
        try:
            for p in range(base, base + n):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        return base
    raise RuntimeError(f"no {n} consecutive free ports")


async def read_rest(call) -> list[Any]:
    """The rest of a gRPC stream whose first messages were taken with `read()`."""
    import grpc

    out = []
    while (msg := await call.read()) is not grpc.aio.EOF:
        out.append(msg)
    return out


async def end_at_random(call, how: str, rng) -> str:
    """End a streaming call as a client would at a seeded random point: `sleep` (cancel after
    up to 0.1 s), `chunks` (cancel after 1-20 messages) or `deadline` (the call's own timeout,
    set by the caller); the outcome: OK (it ran to its end), the status code's name, or
    CANCELLED."""
    import grpc

    try:
        if how == "sleep":
            await asyncio.sleep(rng.uniform(0, 0.1))
            call.cancel()
        elif how == "chunks":
            for _ in range(rng.randint(1, 20)):
                if await call.read() is grpc.aio.EOF:
                    break
            call.cancel()
        while await call.read() is not grpc.aio.EOF:
            pass
        return "OK"
    except grpc.aio.AioRpcError as e:
        return e.code().name
    except asyncio.CancelledError:
        return "CANCELLED"
