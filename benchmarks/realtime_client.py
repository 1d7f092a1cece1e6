"""The measuring client of `bench_realtime`, run in a process of its own.

    python -m benchmarks.realtime_client --target HOST:PORT --streams N [--deployment NAME]
        [--probe-deployment NAME] [--health]

Starts N streams together (64 prompt token ids, 200 output tokens, `ignore_eos`,
`return_token_times`), records every message's wall arrival time and token count and every
token's emulated time, and prints one JSON object of statistics (definitions in
bench_realtime's docstring). With `--probe-deployment` it also sends short requests to that
(otherwise idle) deployment while the streams run, and with `--health` it checks gRPC health
every 20 ms meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from doppelchip.v1 import inference_pb2 as pb
from doppelchip.v1 import inference_pb2_grpc as pb_grpc

PROMPT = list(range(100, 164))  # 64 prompt token ids
TOKENS = 200


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def stream(stub, deployment: str, arrivals: list[float], counts: list[int],
                 times: list[float], sent: list[float]) -> None:
    req = pb.GenerateRequest(
        deployment=deployment, token_ids=pb.TokenIds(ids=PROMPT), return_token_times=True,
        sampling=pb.SamplingParams(max_tokens=TOKENS, ignore_eos=True))
    now = time.perf_counter
    sent.append(now())
    async for msg in stub.Generate(req):
        n = len(msg.token_ids)
        if n:
            arrivals.append(now())
            counts.append(n)
            times.extend(msg.token_times)


def stream_stats(arrivals: list[float], counts: list[int], times: list[float]):
    """(client gaps per token, emulated gaps, emulated span, wall span)."""
    gaps = []
    for i in range(1, len(arrivals)):
        g = (arrivals[i] - arrivals[i - 1]) / counts[i]
        gaps.extend([g] * counts[i])
    emulated = [b - a for a, b in itertools.pairwise(times)]
    return gaps, emulated, (times[-1] - times[0]) if times else 0.0, \
        (arrivals[-1] - arrivals[0]) if arrivals else 0.0


async def probe(stub, deployment: str, stop: asyncio.Event, out: list[tuple[float, float]]):
    """Short requests to an idle deployment: (client latency, emulated e2e) each."""
    await asyncio.sleep(0.3)  # let the saturating streams get going (a schedule, not a sync)
    while not stop.is_set() and len(out) < 20:
        req = pb.GenerateRequest(deployment=deployment, token_ids=pb.TokenIds(ids=PROMPT[:16]),
                                 sampling=pb.SamplingParams(max_tokens=4, ignore_eos=True))
        t0 = time.perf_counter()
        final = None
        async for msg in stub.Generate(req):
            if msg.HasField("final"):
                final = msg.final
        out.append((time.perf_counter() - t0, final.timings.e2e_s if final else 0.0))


async def health(channel, stop: asyncio.Event, out: list[float]) -> None:
    check = health_pb2_grpc.HealthStub(channel).Check
    while not stop.is_set():
        t0 = time.perf_counter()
        await check(health_pb2.HealthCheckRequest(service=""))
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.02)


async def run(args: argparse.Namespace) -> dict:
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(args.target, options=options) as channel:
        stub = pb_grpc.InferenceStub(channel)
        listing = await stub.ListDeployments(pb.ListDeploymentsRequest())
        scale = listing.time_scale or 1.0
        records = [([], [], [], []) for _ in range(args.streams)]
        stop = asyncio.Event()
        probes: list[tuple[float, float]] = []
        checks: list[float] = []
        side = []
        if args.probe_deployment:
            side.append(asyncio.create_task(probe(stub, args.probe_deployment, stop, probes)))
        if args.health:
            side.append(asyncio.create_task(health(channel, stop, checks)))
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(stream(stub, args.deployment, *r) for r in records))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        stop.set()
        await asyncio.gather(*side)
    gaps, emulated, ratios = [], [], []
    msgs = tokens = 0
    first = min(r[0][0] for r in records if r[0])
    last = max(r[0][-1] for r in records if r[0])
    # Token times are relative to each request's arrival: place them on one timeline by the
    # wall time each request was sent (the streams start together; the error is the send
    # jitter, milliseconds against seconds).
    t_send0 = min(r[3][0] for r in records)
    starts = [(r[3][0] - t_send0) / scale + r[2][0] for r in records if r[2]]
    ends = [(r[3][0] - t_send0) / scale + r[2][-1] for r in records if r[2]]
    run_span = max(ends) - min(starts)
    # intake: wall time from sending a request to the engine's clock starting for it (its
    # first message's arrival, less its emulated time to first token): time spent before the
    # front end's handler ran, which the token times cannot show
    intake = [max(0.0, (r[0][0] - r[3][0]) - r[2][0] / scale) for r in records if r[0] and r[2]]
    for arrivals, counts, times, _ in records:
        g, e, emul_span, wall_span = stream_stats(arrivals, counts, times)
        gaps += g
        emulated += e
        msgs += len(counts)
        tokens += sum(counts)
        if wall_span > 0:
            ratios.append(emul_span * scale / wall_span)
    return {
        "streams": args.streams, "time_scale": scale, "wall_s": wall,
        "client_cpu_share": cpu / max(wall, 1e-9),
        "messages": msgs, "tokens": tokens, "tokens_per_message": tokens / max(msgs, 1),
        "messages_per_s": msgs / max(last - first, 1e-9),
        "tokens_per_s": tokens / max(last - first, 1e-9),
        "emulated_tokens_per_s": tokens / max(run_span, 1e-12),
        "delivery_ratio": run_span * scale / max(last - first, 1e-9),
        "client_gap_p50": pct(gaps, 0.5) / scale, "client_gap_p99": pct(gaps, 0.99) / scale,
        "emulated_gap_p50": pct(emulated, 0.5), "emulated_gap_p99": pct(emulated, 0.99),
        "delivery_ratio_median": statistics.median(ratios) if ratios else 0.0,
        "delivery_ratio_min": min(ratios) if ratios else 0.0,
        "intake_p50_s": pct(intake, 0.5), "intake_max_s": max(intake, default=0.0),
        "probe": [{"client_s": c, "emulated_s": e} for c, e in probes],
        "health_p50_s": pct(checks, 0.5), "health_p99_s": pct(checks, 0.99),
        "health_checks": len(checks),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--deployment", default="")
    ap.add_argument("--probe-deployment", default="")
    ap.add_argument("--health", action="store_true")
    args = ap.parse_args()
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
