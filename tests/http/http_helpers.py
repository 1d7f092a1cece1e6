"""What the HTTP tests share: the real server's HTTP base URL, the official `openai` client and
an httpx client on it, SSE parsing, a run whose engine dies under it, and the tokenizer the
server uses (to check usage)."""

from __future__ import annotations

import json

import httpx
import openai

from server.engine.interface import TokenChunk
from server.engine.tokenizer import get_tokenizer
from server.frontend.stream import StreamFailed
from server.http.generate import Run

TOK = get_tokenizer()


def sse_events(lines: list[str]) -> list[dict | str]:
    """The `data:` payloads of an SSE body: dicts, and the final "[DONE]"."""
    out: list[dict | str] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def first_data(lines) -> str:
    """The first SSE data line of `lines` (an aiter_lines() iterator, consumed that far; keep
    it: a dropped iterator closes the response)."""
    async for line in lines:
        if line.startswith("data: "):
            return line
    raise AssertionError("no event")


def openai_client(server) -> openai.AsyncOpenAI:
    """The official client on the server's HTTP port (use with `async with`)."""
    return openai.AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key="none",
                              max_retries=0, timeout=30)


async def pod_released(server) -> None:
    """The pod's (first) deployment holds no request and no KV block."""
    from fleets import assert_released

    from clients.client import AsyncClient

    async with AsyncClient(server.target) as client:
        await assert_released(client, (await client.list_deployments()).deployments[0].name)


def sample_sum(text: str, name: str) -> float:
    """The sum of every sample `name` in a /metrics text, whatever its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


def http_client(server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.http_url, timeout=30)


async def stream_events(http: httpx.AsyncClient, path: str, body: dict,
                        headers: dict | None = None) -> tuple[httpx.Response, list]:
    async with http.stream("POST", path, json=body, headers=headers) as r:
        lines = [line async for line in r.aiter_lines()]
    return r, sse_events(lines)


def retokenized(text: str) -> int:
    """How many tokens a client that re-tokenizes the received text counts."""
    return len(TOK.encode(text))


class DyingStream:
    """A request stream whose engine dies after one chunk."""

    async def outputs(self):
        yield TokenChunk(token_ids=(5,), text=" hi")
        raise StreamFailed("engine process for deployment 'fast' died")


class WatchedRun(Run):
    """A run that records whether it was aborted."""

    aborted = False

    def abort(self) -> None:
        self.aborted = True


async def named_events(http: httpx.AsyncClient, path: str, body: dict) -> list[dict]:
    """A stream of named events (the Messages and Responses APIs'), checked on the wire: each
    `data:` line follows the `event:` line naming its type, and no `[DONE]` closes it."""
    async with http.stream("POST", path, json=body) as r:
        lines = [line async for line in r.aiter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert len(lines) % 2 == 0 and "[DONE]" not in "".join(lines)
    events = [json.loads(data.removeprefix("data: ")) for data in lines[1::2]]
    for name, event in zip(lines[::2], events, strict=True):
        assert name == "event: " + event["type"]
    return events


def aiperf_rankings(server, model: str, tmp_path, calls: int, passages: int) -> list[dict]:
    """AIPerf's `cohere-rankings` against the server (`calls` calls of `passages` 32-token
    passages and a 16-token query, 4 in flight, the server's tokenizer): its records, after
    checking it succeeded and none failed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from server.engine.tokenizer import TOKENIZER_DIR

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # see docs/TOKENIZER
    cmd = [str(Path(sys.executable).parent / "aiperf"), "profile", "-m", model, "--url",
           server.http_url, "--endpoint-type", "cohere-rankings", "--rankings-passages-mean",
           str(passages), "--rankings-passages-stddev", "0",
           "--rankings-passages-prompt-token-mean", "32",
           "--rankings-query-prompt-token-mean", "16", "--tokenizer", str(TOKENIZER_DIR),
           "--request-count", str(calls), "--concurrency", "4", "--ui", "none",
           "--no-gpu-telemetry", "--artifact-dir", str(tmp_path)]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in
               (tmp_path / "profile_export.jsonl").read_text().splitlines()]
    assert len(records) == calls and not any(r.get("error") for r in records)
    return records
