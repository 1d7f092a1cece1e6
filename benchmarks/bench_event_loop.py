"""Does uvloop help grpc.aio here? `python -m benchmarks.bench_event_loop [--rounds N]`.

Starts `doppelchip serve` in a subprocess with each event loop in turn (asyncio, uvloop,
alternating, several rounds), on a one-deployment fleet run 1000x faster than real time (its
steps cost ~0), and drives it from this process with a fixed load: concurrent streams of N
tokens each, and 32 workers making unary ListDeployments calls. Reports tokens/s and unary
calls/s per loop and the ratio uvloop/asyncio (medians over rounds). The serve command's
`--event-loop auto` follows the result recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
max_num_seqs = 256
"""


def start_server(loop: str, config: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "doppelchip.cli", "serve", "--config", str(config), "--port", "0",
         "--metrics-port", "0", "--event-loop", loop, "--log-level", "warning"],
        stderr=subprocess.PIPE, text=True,
    )
    # at warning level the server prints nothing; ask it for its port via a log line instead
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
            return proc, int(m.group(1))
    raise RuntimeError("server did not start")


async def drive(port: int, streams: int, tokens: int, unary: int) -> dict[str, float]:
    from clients.client import AsyncClient

    async with AsyncClient(f"127.0.0.1:{port}") as client:
        await client.list_deployments()  # connect

        async def one() -> int:
            n = 0
            async for chunk in client.generate("x", max_tokens=tokens, ignore_eos=True):
                n += len(chunk.token_ids)
            return n

        t0 = time.perf_counter()
        total = sum(await asyncio.gather(*(one() for _ in range(streams))))
        t_stream = time.perf_counter() - t0
        async def unary_worker(n: int) -> None:
            for _ in range(n):
                await client.list_deployments()

        t0 = time.perf_counter()
        await asyncio.gather(*(unary_worker(unary // 32) for _ in range(32)))
        t_unary = time.perf_counter() - t0
    return {"tokens_per_s": total / t_stream, "unary_per_s": unary / t_unary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--unary", type=int, default=2000)
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"asyncio": [], "uvloop": []}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fleet.toml"
        config.write_text(FLEET)
        for _ in range(args.rounds):
            for loop in ("asyncio", "uvloop"):
                proc, port = start_server(loop, config)
                try:
                    results[loop].append(
                        asyncio.run(drive(port, args.streams, args.tokens, args.unary))
                    )
                finally:
                    proc.terminate()
                    proc.wait(30)
    summary = {
        loop: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for loop, runs in results.items()
    }
    summary["ratio_uvloop_over_asyncio"] = {
        k: summary["uvloop"][k] / summary["asyncio"][k] for k in summary["asyncio"]
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
