"""AsyncEngine: one deployment served in real time — an EngineCore driven by a RealClock.

Handlers only touch the inbox and the abort set (`submit`, `abort`); the loop task is the one
writer of scheduler and KV state. Each step ends at its absolute emulated deadline
`t_start + seconds`, so the loop's own Python time does not accumulate into the timeline;
`lag_s` says how late the last step ended. A `cold` deployment first pays its build/compile
time (state COMPILING: submit answers UNAVAILABLE), a deployment that cannot be placed is
FAILED (submit answers FAILED_PRECONDITION with the reason) and the rest of the fleet serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass

from devices import DeviceError
from server.engine.build import EngineOptions, build_core
from server.engine.clock import RealClock
from server.engine.events import (
    EngineObserver,
    FinishedEvent,
    NullObserver,
    StepEvent,
    TokensEvent,
)
from server.engine.handle import QueueHandle
from server.engine.intake import to_core_request
from server.engine.interface import (
    DeploymentState,
    DeploymentStatus,
    Engine,
    EngineRequest,
    EngineStats,
    FinishReason,
    NotPlaced,
    RequestHandle,
    Unavailable,
)
from server.engine.logs import request_log
from server.engine.output import RequestOutput
from server.engine.request import Request
from server.engine.status import deployment_status
from server.engine.tokenizer import Tokenizer, get_tokenizer

log = logging.getLogger("doppelchip.engine")


@dataclass
class _Live:
    core_request: Request
    output: RequestOutput
    handle: QueueHandle


class AsyncEngine(Engine):
    def __init__(
        self, options: EngineOptions, time_scale: float = 1.0, tokenizer: Tokenizer | None = None
    ) -> None:
        self.options = options
        self.name = options.name
        self.tokenizer = tokenizer or get_tokenizer()
        self.stats = EngineStats()
        self.clock = RealClock(time_scale)
        self.lag_s = 0.0
        self.observer: EngineObserver = NullObserver()  # metrics (the service sets it)
        self.state = DeploymentState.COMPILING
        self.state_message = "starting"
        try:
            self.core = build_core(options, self.tokenizer)
        except (DeviceError, ValueError) as e:
            self.core = None  # type: ignore[assignment]
            self.state, self.state_message = DeploymentState.FAILED, str(e)
        self._inbox: deque[_Live] = deque()
        self._abort_ids: set[str] = set()
        self._live: dict[str, _Live] = {}
        self._t = 0.0  # emulated end of the last step
        self._latest_arrival = 0.0  # of the requests moved into the scheduler so far
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- handler side ---------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> RequestHandle:
        if self.state is DeploymentState.FAILED:
            raise NotPlaced(f"deployment {self.name!r} could not be placed: {self.state_message}")
        if self.state is not DeploymentState.READY:
            raise Unavailable(f"deployment {self.name!r} is {self.state.value}: "
                              f"{self.state_message}")
        core_req = to_core_request(request, self, self.clock.now())
        live = _Live(
            core_req,
            RequestOutput(request, tuple(core_req.prompt_token_ids), self.tokenizer,
                          core_req.arrival_time),
            QueueHandle(request.request_id, tuple(core_req.prompt_token_ids)),
        )
        self._live[request.request_id] = live
        self._inbox.append(live)
        self._idle.clear()
        self._wake.set()
        request_log(log, request.request_id).info(
            "queued on %s: %d prompt tokens, max_tokens=%d", self.name,
            core_req.num_prompt_tokens, core_req.sampling_params.max_tokens,
        )
        return live.handle

    def abort(self, request_id: str) -> None:
        if request_id in self._live:
            self._abort_ids.add(request_id)
            self._wake.set()

    def num_unfinished(self) -> int:
        return len(self._live)

    def is_in_flight(self, request_id: str) -> bool:
        return request_id in self._live

    def energy_and_cost(self) -> tuple[float, float]:
        """Joules and dollars so far, idle time up to now included (read-only: a scrape may
        come while the engine idles, before the loop charges the gap on its next wake)."""
        if self.core is None:
            return 0.0, 0.0
        joules, dollars = self.core.stats.joules, self.core.stats.dollars
        if self._idle.is_set() and self.state is DeploymentState.READY:
            gap = max(0.0, self.clock.now() - self._t)
            joules += self.core.idle_watts * gap
            dollars += self.core.dollars_per_s * gap
        return joules, dollars

    def num_queued(self) -> int:
        """Accepted and not yet running (the admission-control count)."""
        return len(self._inbox) + (self.core.scheduler.num_waiting if self.core else 0)

    async def until_idle(self) -> None:
        await self._idle.wait()

    async def until_ready(self) -> None:
        """Return once a cold deployment has built its engine and serves."""
        await self._ready.wait()

    def status(self) -> DeploymentStatus:
        return deployment_status(self)

    # ---- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self.state is DeploymentState.FAILED:
            log.warning("deployment %s failed: %s", self.name, self.state_message)
            return
        self._task = asyncio.create_task(self._loop(), name=f"engine-{self.name}")

    async def stop(self) -> None:
        if self.state is not DeploymentState.FAILED:
            self.state, self.state_message = DeploymentState.DRAINING, "shutting down"
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._abort_ids.update(self._live)
        self._take_inbox()

    # ---- the loop -------------------------------------------------------------------------
    async def _loop(self) -> None:
        cold = self.options.start == "cold"
        startup = self.core.compiler.startup_seconds(cold)
        if startup > 0:
            self.state_message = f"building its engine: {startup:.1f} s (emulated)"
            self._t = self.clock.now() + startup
            await self.clock.sleep_until(self._t)
            self.observer.on_startup(startup, cold)
        self.state, self.state_message = DeploymentState.READY, "ready"
        self._ready.set()
        self._resync()
        while True:
            self._take_inbox()
            if not self.core.has_unfinished():
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                self._resync()
                continue
            # Busy: the next step starts at the previous step's deadline even when the loop
            # woke late, so Python overhead never accumulates into the emulated timeline —
            # but never before a request it admits has arrived.
            start = max(self._t, self._latest_arrival)
            result = self.core.step()
            if result is None:  # everything waiting is blocked; wait for an abort or arrival
                self._wake.clear()
                await self._wake.wait()
                self._resync()
                continue
            for s in result.output.scheduled:
                if (live := self._live.get(s.request_id)) is not None:
                    if live.output.first_scheduled is None:
                        self.stats.prompt_tokens += live.core_request.num_prompt_tokens
                    live.output.scheduled(start)
            self._t = start + result.seconds
            self.lag_s = await self.clock.sleep_until(self._t)
            self.observer.on_step(StepEvent(start, self._t, result, self.lag_s))
            self._take_inbox()  # aborts that arrived during the step win over its tokens
            self._publish(result)

    def _resync(self) -> None:
        """After idling, the timeline resumes at the wall clock; the gap is charged as idle."""
        now = self.clock.now()
        if now > self._t:
            self.core.account_idle(now - self._t)
            self._t = now

    def _take_inbox(self) -> None:
        while self._inbox:
            live = self._inbox.popleft()
            self._latest_arrival = max(self._latest_arrival, live.core_request.arrival_time)
            self.core.add_request(live.core_request)
        if not self._abort_ids:
            return
        ids, self._abort_ids = self._abort_ids, set()
        for rid in ids:
            if (live := self._live.get(rid)) is not None:
                if self.core is not None:
                    self.core.scheduler.abort(rid)
                self._finish(live, FinishReason.ABORT)

    def _publish(self, result) -> None:
        finished = {r.request_id: r for r in result.finished}
        for rid, tokens in result.new_tokens.items():
            live = self._live.get(rid)
            if live is None:
                continue
            self.stats.generation_tokens += len(tokens)
            self.stats.jump_forward_tokens += result.jump_forward.get(rid, 0)
            previous = live.output.last_token
            chunk = live.output.add(tokens, self._t)
            if chunk is not None:
                live.handle.queue.put_nowait(chunk)
                self.observer.on_tokens(TokensEvent(rid, len(tokens), self._t, previous,
                                                    live.output.arrival))
            if live.output.stopped and rid not in finished:
                self.core.scheduler.abort(rid, FinishReason.STOP)
                self._finish(live, FinishReason.STOP)
        for rid, req in finished.items():
            if (live := self._live.get(rid)) is not None:
                self._finish(live, req.finish_reason or FinishReason.STOP)

    def _finish(self, live: _Live, reason: FinishReason) -> None:
        req = live.core_request
        rid = req.request_id
        out = req.output_token_ids
        stop_token = out[-1] if reason is FinishReason.STOP and out and \
            out[-1] in req.sampling_params.stop_token_ids and live.output.stop_str is None \
            else None
        chunk = live.output.final(reason, max(self._t, self.clock.now()),
                                  max(req.num_cached_tokens, 0), stop_token,
                                  req.num_jump_forward_tokens)
        live.handle.queue.put_nowait(chunk)
        if chunk.finish is not None:
            self.observer.on_request_finished(
                FinishedEvent(rid, chunk.finish, live.output.request.sampling.max_tokens))
        del self._live[rid]
        self.stats.record_finish(rid, reason)
        request_log(log, rid).info("finished on %s: %s after %d tokens", self.name,
                                   reason.value, live.output.num_tokens)
