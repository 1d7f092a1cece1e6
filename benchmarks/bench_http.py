"""HTTP vs gRPC on the same server: `python -m benchmarks.bench_http [--rounds N]`.

Starts one `doppelchip serve` (in its own process tree) on a one-deployment fleet run 1000x
faster than real time, so the emulated device is never the limit and the front end is, then
drives it from this process (the client, in a process of its own) with the same load on both
of the server's paths: `streams` concurrent streaming requests of `tokens` tokens each
(`ignore_eos`), `requests` per stream in a row — over gRPC (`doppelchip.v1.Inference/Generate`,
the project's async client) and over HTTP (`/v1/completions` with `stream: true`, SSE, aiohttp).
Rounds alternate the protocols; the medians of requests/s, streamed tokens/s and messages per
request (gRPC responses / SSE token events: a consumer that falls behind gets several tokens in
one) are reported for 64 and 256 streams, with the ratio HTTP/gRPC (target: streamed
tokens/s >= 0.7).
Results, with the machine and its load, are recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = """
[server]
time_scale = 0.001
[[deployments]]
name = "bench"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
max_model_len = 4096
max_num_seqs = 512
max_waiting = 4096
"""


def start_server(config: Path) -> tuple[subprocess.Popen, int, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "doppelchip.cli", "serve", "--config", str(config), "--port", "0",
         "--http-port", "0", "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # the listening line is printed at every log level
        if m := re.search(r"listening on 127\.0\.0\.1:(\d+) \(HTTP and metrics on "
                          r"127\.0\.0\.1:(\d+)\)", line):
            return proc, int(m.group(1)), int(m.group(2))
    raise RuntimeError("server did not start")


async def grpc_load(port: int, streams: int, requests: int,
                    tokens: int) -> tuple[int, int, int]:
    from clients.client import AsyncClient

    async with AsyncClient(f"127.0.0.1:{port}") as client:
        await client.list_deployments()  # connected before the clock starts

        async def worker() -> tuple[int, int]:
            n = messages = 0
            for _ in range(requests):
                async for chunk in client.generate("bench", max_tokens=tokens,
                                                   ignore_eos=True):
                    n += len(chunk.token_ids)
                    messages += 1
            return n, messages

        done = await asyncio.gather(*(worker() for _ in range(streams)))
        return streams * requests, sum(d[0] for d in done), sum(d[1] for d in done)


async def http_load(port: int, streams: int, requests: int,
                    tokens: int) -> tuple[int, int, int]:
    import aiohttp

    body = {"prompt": "bench", "max_tokens": tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=connector) as s:
        async with s.get("/health") as r:
            assert r.status == 200

        async def worker() -> tuple[int, int]:
            n = messages = 0
            for _ in range(requests):
                last = b""
                async with s.post("/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            last = line
                            messages += 1
                usage = json.loads(last[6:])["usage"]  # the include_usage chunk
                n += usage["completion_tokens"]
                messages -= 1  # the usage event carries no token
            return n, messages

        done = await asyncio.gather(*(worker() for _ in range(streams)))
        return streams * requests, sum(d[0] for d in done), sum(d[1] for d in done)


def measure(load, port: int, streams: int, requests: int, tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    n_req, n_tok, n_msg = asyncio.run(load(port, streams, requests, tokens))
    dt = time.perf_counter() - t0
    assert n_tok == n_req * tokens, (n_tok, n_req * tokens)
    return {"requests_per_s": n_req / dt, "tokens_per_s": n_tok / dt,
            "messages_per_request": n_msg / n_req}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per request")
    ap.add_argument("--tokens-per-stream", type=int, default=512,
                    help="tokens each stream receives per round (requests = this / --tokens)")
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    args = ap.parse_args()
    requests = max(1, args.tokens_per_stream // args.tokens)
    before = os.getloadavg()  # other work on the machine (the benchmark itself adds ~2)
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fleet.toml"
        config.write_text(FLEET)
        proc, grpc_port, http_port = start_server(config)
        try:
            for streams in args.streams:
                runs: dict[str, list[dict[str, float]]] = {"grpc": [], "http": []}
                for _ in range(args.rounds):
                    runs["grpc"].append(measure(grpc_load, grpc_port, streams, requests,
                                                args.tokens))
                    runs["http"].append(measure(http_load, http_port, streams, requests,
                                                args.tokens))
                med = {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                       for p, rs in runs.items()}
                med["http_over_grpc"] = {k: med["http"][k] / med["grpc"][k]
                                         for k in med["grpc"]}
                out[f"{streams}_streams"] = med
        finally:
            proc.terminate()
            proc.wait(30)
    out["setup"] = {"rounds": args.rounds, "tokens_per_request": args.tokens,
                    "requests_per_stream": requests, "cpus": os.cpu_count(),
                    "load_average_before": before, "load_average_at_end": os.getloadavg()}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
