"""Drive a gRPC server with a workload and record what every request saw.

Open loop (the default): each conversation starts at its scheduled time whatever the server
is doing, and latencies are measured from that *scheduled* time, so queueing is not hidden
(coordinated omission). Closed loop (`concurrency=N`): N workers send conversations back to
back, never more than N requests in flight; a request's scheduled time is its send time.

Times are reported on the emulated timeline: a server running at `time_scale` s (wall seconds
per emulated second) is driven with the schedule stretched by s, and every measured wall
interval is divided by s, so a report from a fast-forwarded server reads like one from a
server at true speed — and compares directly with the same workload in virtual time.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from clients.client import AsyncClient
from clients.conversation import Conversation, turn_prompt
from clients.report import RequestResult
from doppelchip.v1 import inference_pb2 as pb

SEND_LAG_WARN_S = 0.010  # wall seconds an open-loop send may start late before we warn
CPU_WARN_SHARE = 0.9  # the load generator's own CPU use (of one core) before we warn
LAG_WARN_FRACTION = 0.10  # client E2E this much above the server's emulated E2E: warn


@dataclass
class LoadRun:
    results: list[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0
    max_send_lag_s: float = 0.0  # emulated seconds an open-loop send left after its schedule
    max_in_flight: int = 0
    warnings: list[str] = field(default_factory=list)
    # (client-measured, server-reported) E2E per request, both emulated seconds: far apart
    # means the host (server or client) did not keep up with the server's time_scale
    e2e_pairs: list[tuple[float, float]] = field(default_factory=list)
    probe_before: dict[str, float] = field(default_factory=dict)  # `probe()` at the start
    probe_after: dict[str, float] = field(default_factory=dict)  # and at the end


class _Driver:
    def __init__(self, client: AsyncClient, deployment: str, time_scale: float,
                 run: LoadRun, on_result: Callable[[RequestResult], None] | None) -> None:
        self.client = client
        self.deployment = deployment
        self.scale = time_scale
        self.run = run
        self.on_result = on_result
        self.t0 = time.perf_counter()
        self.in_flight = 0

    def now(self) -> float:
        """Emulated seconds since the run started."""
        return (time.perf_counter() - self.t0) / self.scale

    async def wait_until(self, t: float) -> None:
        delay = (t - self.now()) * self.scale
        if delay > 0:
            await asyncio.sleep(delay)  # the schedule itself, not synchronisation

    async def conversation(self, conv: Conversation, closed: bool) -> None:
        history: tuple[int, ...] = ()
        start: float | None = None if closed else conv.start_s  # closed: back to back
        for k, turn in enumerate(conv.turns):
            if k:
                start = self.now() + turn.think_time_s
            if start is not None:
                await self.wait_until(start)
            # closed loop: a request is scheduled when it is sent (no schedule to fall behind)
            scheduled = None if closed else start
            prompt = turn_prompt(history, turn)
            result, output = await self.request(conv, k, prompt, turn.max_tokens, scheduled)
            if result.error is not None:
                return  # the conversation cannot continue without its history
            history = prompt + tuple(output)

    async def request(self, conv: Conversation, k: int, prompt: tuple[int, ...],
                      max_tokens: int, scheduled: float | None
                      ) -> tuple[RequestResult, list[int]]:
        rid = f"{conv.conversation_id}/{k}" if len(conv.turns) > 1 else conv.conversation_id
        sent = self.now()
        scheduled = sent if scheduled is None else scheduled
        self.run.max_send_lag_s = max(self.run.max_send_lag_s, sent - scheduled)
        self.in_flight += 1
        self.run.max_in_flight = max(self.run.max_in_flight, self.in_flight)
        times: list[float] = []
        output: list[int] = []
        final = None
        error = None
        constraint = {}
        if conv.constraint is not None:  # (kind, text); a choice list travels as JSON text
            kind, text = conv.constraint
            constraint = {kind: json.loads(text) if kind == "choice" else text}
        try:
            async for chunk in self.client.generate(
                list(prompt), deployment=self.deployment, request_id=rid,
                max_tokens=max_tokens, ignore_eos=conv.ignore_eos, seed=conv.seed, **constraint,
            ):
                if chunk.token_ids:
                    t = self.now()
                    times += [t] * len(chunk.token_ids)
                    output += chunk.token_ids
                if chunk.HasField("final"):
                    final = chunk.final
        except grpc.aio.AioRpcError as e:
            error = e.code().name
        finally:
            self.in_flight -= 1
        usage = final.usage if final is not None else None
        result = RequestResult(
            request_id=rid, scheduled_s=scheduled, sent_s=sent, token_times=tuple(times),
            end_s=self.now(), prompt_tokens=len(prompt),
            output_tokens=usage.completion_tokens if usage else len(output),
            cached_tokens=usage.cached_prompt_tokens if usage else 0,
            jump_forward_tokens=usage.jump_forward_tokens if usage else 0,
            finish_reason=_reason(final) if final is not None else "error", error=error,
            conversation_id=conv.conversation_id, turn=k,
        )
        self.run.results.append(result)
        if final is not None and error is None:
            self.run.e2e_pairs.append((result.end_s - sent, final.timings.e2e_s))
        if self.on_result is not None:
            self.on_result(result)
        return result, output


def _reason(final: pb.Final) -> str:
    return pb.FinishReason.Name(final.finish_reason).removeprefix("FINISH_REASON_").lower()


async def run_load(
    target: str,
    conversations: list[Conversation],
    *,
    deployment: str = "",
    concurrency: int | None = None,
    time_scale: float = 1.0,
    time_limit_s: float | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
    probe: Callable[[], dict[str, float]] | None = None,
    security: Mapping[str, Any] | None = None,
) -> LoadRun:
    """Run the workload against `target` (host:port, loopback); bounded by `time_limit_s`
    (emulated seconds; requests still running then are cancelled and recorded as errors);
    `security`: `AsyncClient`'s TLS and API-key arguments."""
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if time_scale <= 0:
        raise ValueError("time_scale must be > 0")
    run = LoadRun()
    cpu0 = time.process_time()
    async with AsyncClient(target, **(security or {})) as client:
        await client.list_deployments()  # connect before the clock starts
        if probe is not None:
            run.probe_before = probe()  # e.g. the server's energy counters, right at t0
        driver = _Driver(client, deployment, time_scale, run, on_result)
        if concurrency is None:
            work = [driver.conversation(c, closed=False) for c in conversations]
        else:
            queue = list(reversed(conversations))

            async def worker() -> None:
                while queue:
                    await driver.conversation(queue.pop(), closed=True)

            work = [worker() for _ in range(min(concurrency, len(conversations)))]
        limit = None if time_limit_s is None else time_limit_s * time_scale
        tasks = [asyncio.ensure_future(w) for w in work]
        done, pending = await asyncio.wait(tasks, timeout=limit)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # surface a bug in the driver itself
        run.wall_s = time.perf_counter() - driver.t0
        if probe is not None:
            run.probe_after = probe()
    if pending:
        run.warnings.append(f"time limit reached: {len(pending)} conversations cut short")
    cpu_share = (time.process_time() - cpu0) / max(run.wall_s, 1e-9)
    if cpu_share > CPU_WARN_SHARE:
        run.warnings.append(f"this process used {cpu_share:.0%} of a core during the load: "
                            "results may be client-bound")
    if concurrency is None and run.max_send_lag_s * time_scale > SEND_LAG_WARN_S:
        run.warnings.append(
            f"the client fell behind its schedule by up to "
            f"{run.max_send_lag_s * time_scale * 1e3:.1f} ms of wall time: results may be "
            "client-bound"
        )
    if run.e2e_pairs:
        client = statistics.median(c for c, _ in run.e2e_pairs)
        server = statistics.median(s for _, s in run.e2e_pairs)
        if server > 0 and client > server * (1 + LAG_WARN_FRACTION):
            run.warnings.append(
                f"median E2E measured here is {client / server - 1:.0%} above the server's "
                f"emulated timeline ({client:.3f} s vs {server:.3f} s): the host cannot keep "
                f"up at time_scale {time_scale:g}; use a larger time_scale"
            )
    return run
