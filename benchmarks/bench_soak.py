"""Soak: `python -m benchmarks.bench_soak [--minutes 10] [--workers 24] [--out FILE]`.

Starts one `doppelchip serve` on loopback (two deployments, two front ends, so every kind of
server process is there: supervisor, forkserver, engine cores, front ends) and drives it with
the mixed load of `benchmarks/soak_load.py` from this process for `--minutes`. Every
`--interval` seconds it samples the resident memory (RSS) and open file descriptors summed
over ALL the server's processes (the supervisor and its descendants, through psutil), prints
a row and, at the end, writes the table (one row per minute) to `--out` (default
`out/bench_soak.md`, git-ignored).

Verdict: RSS flat within 10 MB after warm-up (the first `--warmup` minutes): the spread of the
per-minute medians after warm-up. Then the logging check: a malformed IPC message is pushed
into the supervisor's, each front end's and one engine's input socket (the engine crashes on
it and is restarted), and the one server log must hold a traceback from each of them, under a
line tagged with that process's name. Results go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import zmq

from benchmarks.soak_load import Load

FLEET = """
[server]
time_scale = 0.05
api_server_count = 2
drain_grace_s = 5.0
vllm_engine_deployment = "soak-a"
engine_restart_backoff_s = 0.5
[[deployments]]
name = "soak-a"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
max_model_len = 2048
max_waiting = 64
[[deployments]]
name = "soak-b"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "sglang"
max_model_len = 2048
max_num_seqs = 16
max_waiting = 16
"""
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+) \(HTTP and metrics on "
                       r"127\.0\.0\.1:(\d+)\)")
FLAT_MB = 10.0


def start(workdir: Path) -> tuple[subprocess.Popen, int, int, Path]:
    (workdir / "fleet.toml").write_text(FLEET)
    log = workdir / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "doppelchip.cli", "serve", "--config",
         str(workdir / "fleet.toml"), "--port", "0", "--http-port", "0", "--log-level",
         "warning", "--check-integrity"], stderr=log.open("w"), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if m := LISTENING.search(log.read_text()):
            return proc, int(m.group(1)), int(m.group(2)), log
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"server did not start:\n{log.read_text()}")


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def sample(pid: int) -> tuple[float, int, int]:
    """(RSS in MB, open fds, processes) summed over the server's process tree."""
    rss = fds = n = 0
    for p in tree(pid):
        try:
            rss += p.memory_info().rss
            fds += p.num_fds()
            n += 1
        except psutil.NoSuchProcess:
            continue
    return rss / 2**20, fds, n


def run_dir(pid: int) -> Path:
    """The server's private run directory (its processes hold its stats files open)."""
    for p in tree(pid):
        for f in p.open_files():
            if re.search(r"/doppelchip-[^/]+/[ef]\d", f.path):
                return Path(f.path).parent
    raise RuntimeError("no run directory found")


async def drive(grpc_port: int, http_port: int, pid: int, minutes: float, workers: int,
                interval: float) -> tuple[list[tuple[float, float, int, int, int]], Load]:
    load = Load(grpc_port, http_port)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    deadline = t0 + minutes * 60
    tasks = [asyncio.create_task(load.worker(seed, deadline)) for seed in range(workers)]
    rows = []
    while loop.time() < deadline:
        await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))
        rss, fds, n = await asyncio.to_thread(sample, pid)
        rows.append((loop.time() - t0, rss, fds, n, load.tally.total))
        print(f"{rows[-1][0]:7.0f} s  RSS {rss:7.1f} MB  fds {fds:4d}  processes {n}  "
              f"requests {load.tally.total}", flush=True)
    await asyncio.gather(*tasks)
    await load.close()
    return rows, load


def per_minute(rows) -> list[tuple[int, float, float, float, int, int]]:
    """(minute, median RSS, min RSS, max RSS, max fds, requests by then) per minute."""
    out = []
    last = max(1, math.ceil(rows[-1][0] / 60 - 0.01))  # the closing sample is the last minute's
    for minute in range(last):
        part = [r for r in rows if minute * 60 < r[0] <= (minute + 1) * 60
                or (minute == last - 1 and r[0] > last * 60)]
        if part:
            rss = [r[1] for r in part]
            out.append((minute + 1, statistics.median(rss), min(rss), max(rss),
                        max(r[2] for r in part), part[-1][4]))
    return out


def table(minutes, start_rss: float, start_fds: int) -> str:
    lines = [f"start (idle, after start-up): RSS {start_rss:.1f} MB, fds {start_fds}", "",
             "| minute | RSS median MB | RSS min–max MB | fds max | requests so far |",
             "|---|---|---|---|---|"]
    lines += [f"| {m} | {med:.1f} | {lo:.1f}–{hi:.1f} | {fds} | {n:,} |"
              for m, med, lo, hi, fds, n in minutes]
    return "\n".join(lines)


def inject_faults(pid: int, log: Path) -> dict[str, bool]:
    """Push one malformed message into each process's input socket; say which traceback
    reached the server log."""
    run = run_dir(pid)
    ctx = zmq.Context()
    targets = {"supervisor": run / "supervisor.in", "engine[soak-a/0]": run / "e0.0.in",
               **{f"frontend[{i}]": run / f"f{i}.in" for i in range(2)}}
    for path in targets.values():
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 2000)
        s.connect(f"ipc://{path}")
        s.send(b"\xc1 not a message")
        s.close()
    ctx.term()
    found: dict[str, bool] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = log.read_text()
        found = {name: _traceback_of(name, text) for name in targets}
        if all(found.values()):
            break
        time.sleep(0.2)
    return found


def _traceback_of(name: str, text: str) -> bool:
    """Whether the log holds a traceback under a line tagged with process `name`."""
    return bool(re.search(rf"(ERROR|WARNING) {re.escape(name)} .*\n(?:.*\n)*?Traceback "
                          r"\(most recent call last\)", text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=24)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0, help="minutes of warm-up")
    ap.add_argument("--out", default="out/bench_soak.md",  # (out/ is git-ignored)
                    help="the table, as Markdown")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as d:
        proc, grpc_port, http_port, log = start(Path(d))
        try:
            start_rss, start_fds, n = sample(proc.pid)
            print(f"server pid {proc.pid}: {n} processes, RSS {start_rss:.1f} MB, "
                  f"fds {start_fds}; load average {os.getloadavg()[0]:.2f}", flush=True)
            rows, load = asyncio.run(drive(grpc_port, http_port, proc.pid, args.minutes,
                                           args.workers, args.interval))
            minutes = per_minute(rows)
            text = table(minutes, start_rss, start_fds)
            after = [m for m in minutes if m[0] > args.warmup] or minutes
            spread = max(m[1] for m in after) - min(m[1] for m in after)
            verdict = (f"RSS after warm-up (minutes > {args.warmup:g}): medians "
                       f"{min(m[1] for m in after):.1f}–{max(m[1] for m in after):.1f} MB, "
                       f"spread {spread:.1f} MB: "
                       f"{'flat' if spread <= FLAT_MB else 'NOT flat'} (target ≤ {FLAT_MB:g}"
                       f" MB); fds {min(m[4] for m in after)}–{max(m[4] for m in after)}")
            tracebacks_under_load = log.read_text().count("Traceback")
            found = inject_faults(proc.pid, log)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
        outcomes = "\n".join(f"- {k}: {v:,}" for k, v in sorted(load.tally.counts.items()))
        report = (f"{text}\n\n{verdict}\n\nrequests: {load.tally.total:,}; unexpected "
                  f"outcomes: {dict(load.tally.unexpected) or 'none'}\n{outcomes}\n\n"
                  f"tracebacks in the log under load: {tracebacks_under_load}; injected "
                  f"faults' tracebacks in the one log: {found}; exit status {code}; load "
                  f"average at the end {os.getloadavg()[0]:.2f}\n")
        print(report)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
