"""Real time at saturation: `python -m benchmarks.bench_realtime [--quick] [--out FILE]`.

Everything in one run on this machine, each server in its own process tree and the measuring
client (`benchmarks/realtime_client.py`) in another. Each stream is one request of 64 prompt
token ids, 200 output tokens, `ignore_eos`, `return_token_times`, all streams started together.
- client gap: each message's wall gap ÷ its token count, counted once per token, the first
  message excluded (scaled to emulated seconds); emulated gap: consecutive `token_times`;
- delivery ratio: a stream's emulated span of token times ÷ the wall span over which the same
  tokens arrived (median and worst over the streams); the run's: all streams' token times
  placed by their send times, so it also counts the intake;
- intake: the wall time from sending a request to the engine's clock starting for it (its
  first message's arrival less its emulated time to first token, scaled), p50 and max;
Cases (issue 11): (a) the ceiling — a bare grpc.aio server on uvloop streaming one
GenerateResponse per token with its token_times — against doppelchip with a zero-cost
deployment (time scale 0.001, `--stream-interval 1`), 64 and 256 streams; (b) `vllm-h100` at true
speed, 1/64/256/512 streams; (c) `cerebras-cs3`, 1 and 64 streams, with `--stream-interval 4`
(and 1 for reference); (d) an idle deployment's request latency and gRPC health-check latency
while `vllm-h100` is saturated (256 streams). Targets are checked and printed with the margin.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ZERO_COST = """
[server]
time_scale = 0.001
[[deployments]]
name = "zero"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
max_num_seqs = 512
"""


# ---- the ceiling: a bare grpc.aio server --------------------------------------------------------
async def _ceiling(ready: Path) -> None:
    import grpc

    from doppelchip.v1 import inference_pb2 as pb
    from doppelchip.v1 import inference_pb2_grpc as pb_grpc

    class Bare(pb_grpc.InferenceServicer):
        async def Generate(self, request, context):
            n = request.sampling.max_tokens
            for i in range(n):
                yield pb.GenerateResponse(token_ids=[i + 1], token_times=[i * 0.001], index=i)

        async def ListDeployments(self, request, context):
            return pb.ListDeploymentsResponse(time_scale=1.0)

    server = grpc.aio.server()
    pb_grpc.add_InferenceServicer_to_server(Bare(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready.write_text(str(port))
    await server.wait_for_termination()


def ceiling_main(ready: str) -> None:
    import uvloop

    uvloop.run(_ceiling(Path(ready)))


# ---- servers and the client ---------------------------------------------------------------------
class Server:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "doppelchip.cli", "serve",
                                      "--port", "0", "--metrics-port", "0", *args],
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        self.log: list[str] = []
        for line in self.proc.stderr:
            if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
                self.target = f"127.0.0.1:{m.group(1)}"
                break
        else:
            raise RuntimeError("doppelchip did not start")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:  # keep the pipe from filling (and keep the warnings)
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class Ceiling:
    def __init__(self) -> None:
        self.ready = Path(tempfile.mkstemp()[1])
        self.ready.write_text("")
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_realtime",
                                      "--ceiling", str(self.ready)])
        deadline = time.monotonic() + 30
        while not self.ready.read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the ceiling server did not start")
            time.sleep(0.05)
        self.target = f"127.0.0.1:{self.ready.read_text()}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.ready.unlink()


def client(target: str, streams: int, deployment: str = "", **flags: str | bool) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.realtime_client", "--target", target,
           "--streams", str(streams), "--deployment", deployment]
    for k, v in flags.items():
        if v is True:
            cmd.append(f"--{k.replace('_', '-')}")
        elif v:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(runs: list[dict], key: str) -> dict:
    return max(runs, key=lambda r: r[key])


def median_run(runs: list[dict], key: str) -> dict:
    return sorted(runs, key=lambda r: r[key])[len(runs) // 2]


# ---- the cases ----------------------------------------------------------------------------------
def case_a(rounds: int) -> list[dict]:
    rows = []
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(ZERO_COST)
    try:
        for streams in (64, 256):
            ceiling = Ceiling()
            try:
                bare = [client(ceiling.target, streams) for _ in range(rounds)]
            finally:
                ceiling.stop()
            server = Server(["--config", f.name, "--log-level", "warning",
                             "--stream-interval", "1"])
            try:
                ours = [client(server.target, streams) for _ in range(rounds)]
            finally:
                server.stop()
            b, o = median_run(bare, "messages_per_s"), median_run(ours, "messages_per_s")
            rows.append({"case": "a", "streams": streams, "ceiling": b, "doppelchip": o,
                         "ratio": o["messages_per_s"] / b["messages_per_s"]})
    finally:
        os.unlink(f.name)
    return rows


def case_true_speed(deployment: str, streams_list: tuple[int, ...], interval: int,
                    rounds: int) -> list[dict]:
    rows = []
    server = Server(["--log-level", "warning", "--stream-interval", str(interval)])
    try:
        for streams in streams_list:
            runs = [client(server.target, streams, deployment) for _ in range(rounds)]
            rows.append({"deployment": deployment, "streams": streams, "interval": interval,
                         **median_run(runs, "delivery_ratio")})
    finally:
        server.stop()
    return rows


def case_d(rounds: int) -> dict:
    server = Server(["--log-level", "warning"])
    try:
        runs = [client(server.target, 256, "vllm-h100", probe_deployment="trtllm-h100",
                       health=True) for _ in range(rounds)]
    finally:
        server.stop()
    r = median_run(runs, "health_p99_s")
    ratios = [p["client_s"] / p["emulated_s"] for p in r["probe"] if p["emulated_s"] > 0]
    return {"health_p50_s": r["health_p50_s"], "health_p99_s": r["health_p99_s"],
            "health_checks": r["health_checks"], "probe_requests": len(ratios),
            "probe_client_over_emulated_median": sorted(ratios)[len(ratios) // 2]
            if ratios else 0.0, "saturated_delivery_ratio": r["delivery_ratio"]}


def verdict(ok: bool, text: str) -> str:
    return f"{'PASS' if ok else 'MISS'}  {text}"


def report(res: dict) -> list[str]:
    lines = [f"machine: {os.cpu_count()} cores, load average before the run "
             f"{res['loadavg'][0]:.2f}", ""]
    lines.append("(a) ceiling vs doppelchip with a zero-cost deployment, --stream-interval 1")
    lines.append("streams | ceiling msg/s | doppelchip msg/s | tokens/s | tokens/msg | ratio")
    for r in res["a"]:
        c, o = r["ceiling"], r["doppelchip"]
        lines.append(f"{r['streams']:7d} | {c['messages_per_s']:13,.0f} | "
                     f"{o['messages_per_s']:16,.0f} | {o['tokens_per_s']:8,.0f} | "
                     f"{o['tokens_per_message']:10.1f} | {r['ratio']:.2f}")
    lines.append("")
    lines.append("(b, c) true speed: deployment streams interval | client tok/s | emulated "
                 "tok/s | delivery (run; stream median, min) | gap p50 client/emulated ms | "
                 "gap p99 client ms | tok/msg | intake p50 / max ms")
    for r in res["b"] + res["c"]:
        lines.append(
            f"{r['deployment']} {r['streams']} {r['interval']} | {r['tokens_per_s']:,.0f} | "
            f"{r['emulated_tokens_per_s']:,.0f} | {r['delivery_ratio']:.3f}; "
            f"{r['delivery_ratio_median']:.3f}, {r['delivery_ratio_min']:.3f} | "
            f"{r['client_gap_p50'] * 1e3:.3f} / "
            f"{r['emulated_gap_p50'] * 1e3:.3f} | {r['client_gap_p99'] * 1e3:.2f} | "
            f"{r['tokens_per_message']:.2f} | {r['intake_p50_s'] * 1e3:.0f} / "
            f"{r['intake_max_s'] * 1e3:.0f}")
    d = res["d"]
    lines += ["", f"(d) while vllm-h100 runs 256 streams: gRPC health p50 "
              f"{d['health_p50_s'] * 1e3:.1f} ms, p99 {d['health_p99_s'] * 1e3:.1f} ms "
              f"({d['health_checks']} checks); idle trtllm-h100 requests: client/emulated "
              f"latency median {d['probe_client_over_emulated_median']:.3f} "
              f"({d['probe_requests']} requests)", "", "targets:"]
    a256 = next(r for r in res["a"] if r["streams"] == 256)
    lines.append(verdict(a256["ratio"] >= 0.8, f"zero-cost 256 streams: {a256['ratio']:.2f} of "
                         "the ceiling's messages/s (target >= 0.80)"))
    h = next(r for r in res["b"] if r["streams"] == 256)
    gap = h["client_gap_p50"] / h["emulated_gap_p50"] - 1
    lines.append(verdict(h["delivery_ratio"] >= 0.95 and abs(gap) <= 0.05,
                         f"vllm-h100 256 streams: delivery {h['delivery_ratio']:.3f} "
                         f"(>= 0.95), client gap p50 {gap:+.1%} of emulated (within 5%)"))
    cer = next(r for r in res["c"] if r["streams"] == 64 and r["interval"] == 4)
    lines.append(verdict(cer["delivery_ratio"] >= 0.95,
                         f"cerebras-cs3 64 streams, interval 4: delivery "
                         f"{cer['delivery_ratio']:.3f} (>= 0.95)"))
    lines.append(verdict(d["health_p99_s"] < 0.1, f"health p99 {d['health_p99_s'] * 1e3:.1f} ms "
                         "(< 100 ms)"))
    idle = d["probe_client_over_emulated_median"] - 1
    lines.append(("PASS  " if abs(idle) <= 0.05 else "REPORT") + f" idle deployment latency "
                 f"{idle:+.1%} of its emulated timeline (target within 5% where each engine and "
                 f"the client have a core; this machine has {os.cpu_count()})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round per case instead of three")
    ap.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--ceiling", metavar="READY_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ceiling:
        ceiling_main(args.ceiling)
        return
    rounds = 1 if args.quick else 3
    res = {"loadavg": os.getloadavg()}
    res["a"] = case_a(rounds)
    res["b"] = case_true_speed("vllm-h100", (1, 64, 256, 512), 1, rounds)
    res["c"] = (case_true_speed("cerebras-cs3", (1, 64), 4, rounds)
                + case_true_speed("cerebras-cs3", (64,), 1, rounds))
    res["d"] = case_d(rounds)
    print("\n".join(report(res)))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
