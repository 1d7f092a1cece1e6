"""PlaceholderEngine: the final engine interface over a fixed-cost stand-in device.

This is a clearly named placeholder until the scheduler-driven engine lands: no paging, no
prefix cache, no roofline. It admits requests FCFS while KV blocks last (reserving each request's
prompt + max_tokens up front), runs every admitted request one token per step, and charges a
fixed emulated cost per step (`decode_step_s` plus `prefill_token_s` per newly admitted prompt
token) on a `RealClock`. Tokens come from a deterministic O(1)-per-token rolling hash of
(seed, context) over a byte tokenizer, so identical requests stream identical text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from server.engine.clock import RealClock
from server.engine.interface import (
    Capacity,
    DeploymentState,
    DeploymentStatus,
    Engine,
    EngineRequest,
    EngineStats,
    FinishReason,
    InvalidRequest,
    Overloaded,
    RequestHandle,
    TokenChunk,
    Unavailable,
)
from server.engine.live import LiveRequest, PlaceholderConfig
from server.engine.logs import request_log

log = logging.getLogger("doppelchip.engine")


class _Handle(RequestHandle):
    def __init__(self, request_id: str, prompt_token_ids: tuple[int, ...]) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.queue: asyncio.Queue[TokenChunk] = asyncio.Queue()

    async def outputs(self):  # type: ignore[override]
        while True:
            chunk = await self.queue.get()
            # A slow consumer gets what piled up as one message, not one message per token.
            while chunk.finish is None and not self.queue.empty():
                chunk = chunk.merge(self.queue.get_nowait())
            yield chunk
            if chunk.finish is not None:
                return


class PlaceholderEngine(Engine):
    def __init__(self, config: PlaceholderConfig) -> None:
        self.config = config
        self.name = config.name
        self.stats = EngineStats()
        self.clock = RealClock(config.time_scale)
        self.lag_s = 0.0  # how far the last step ended behind its emulated deadline
        self._state = DeploymentState.COMPILING
        self._inbox: deque[LiveRequest] = deque()  # submitted by handlers, taken by the loop
        self._abort_ids: set[str] = set()
        self._waiting: deque[LiveRequest] = deque()
        self._running: dict[str, LiveRequest] = {}
        self._live_ids: set[str] = set()
        self._free_blocks = config.kv_blocks
        self._t = 0.0  # the emulated timeline: end of the last step
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    # ---- handler side: never mutates scheduler state, only the inbox -------------------------
    def submit(self, request: EngineRequest) -> RequestHandle:
        cfg = self.config
        if self._state is not DeploymentState.READY:
            raise Unavailable(f"deployment {self.name!r} is {self._state.value}")
        request.sampling.validate()
        if request.request_id in self._live_ids:
            raise InvalidRequest(f"request id {request.request_id!r} is already in flight")
        ids = self._prompt_ids(request)
        max_tokens = request.sampling.max_tokens or cfg.max_model_len - len(ids)
        if len(ids) + max_tokens > cfg.max_model_len:
            raise InvalidRequest(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds deployment "
                f"{self.name!r}'s context of {cfg.max_model_len} tokens"
            )
        if len(self._inbox) + len(self._waiting) >= cfg.max_waiting:
            raise Overloaded(
                f"deployment {self.name!r}: waiting queue is full "
                f"(max_waiting={cfg.max_waiting})"
            )
        live = LiveRequest(request, ids, max_tokens, _Handle(request.request_id, ids), cfg)
        live.arrival = self.clock.now()
        self._live_ids.add(request.request_id)
        self._inbox.append(live)
        self._idle.clear()
        self._wake.set()
        request_log(log, request.request_id).info(
            "queued on %s: %d prompt tokens, max_tokens=%d", self.name, len(ids), max_tokens
        )
        return live.handle

    def _prompt_ids(self, request: EngineRequest) -> tuple[int, ...]:
        cfg = self.config
        if request.prompt_token_ids is not None:
            ids = request.prompt_token_ids
            bad = [t for t in ids if not 0 <= t < cfg.tokenizer.vocab_size]
            if bad:
                raise InvalidRequest(
                    f"token id {bad[0]} is outside the vocabulary [0, {cfg.tokenizer.vocab_size})"
                )
        else:
            ids = tuple(cfg.tokenizer.encode(request.prompt_text or ""))
        if not ids:
            raise InvalidRequest("prompt is empty")
        if len(ids) >= cfg.max_model_len:
            raise InvalidRequest(
                f"prompt is {len(ids)} tokens; deployment {self.name!r} has a context of "
                f"{cfg.max_model_len} tokens"
            )
        return ids

    def abort(self, request_id: str) -> None:
        if request_id in self._live_ids:
            self._abort_ids.add(request_id)
            self._wake.set()

    def num_unfinished(self) -> int:
        return len(self._live_ids)

    async def until_idle(self) -> None:
        await self._idle.wait()

    def status(self) -> DeploymentStatus:
        c = self.config
        per_request = -(-c.max_model_len // c.block_size)
        return DeploymentStatus(
            name=c.name, model=c.model, quant=c.quant, engine=c.engine, chip=c.chip,
            chip_count=c.chip_count, tensor_parallel=c.tensor_parallel,
            pipeline_parallel=c.pipeline_parallel, state=self._state,
            state_message="placeholder engine (fixed step cost)",
            capacity=Capacity(
                kv_blocks_total=c.kv_blocks, kv_blocks_free=self._free_blocks,
                block_size=c.block_size, max_model_len=c.max_model_len,
                max_num_seqs=c.max_num_seqs, max_concurrency=c.kv_blocks // per_request,
                max_waiting=c.max_waiting,
            ),
            num_running=len(self._running),
            num_waiting=len(self._waiting) + len(self._inbox),
        )

    # ---- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._state = DeploymentState.READY
        self._task = asyncio.create_task(self._loop(), name=f"engine-{self.name}")

    async def stop(self) -> None:
        self._state = DeploymentState.DRAINING
        self._abort_ids.update(self._live_ids)
        self._take_inbox_and_aborts()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- the loop: the only writer of waiting/running/blocks ------------------------------
    async def _loop(self) -> None:
        while True:
            self._take_inbox_and_aborts()
            if not self._waiting and not self._running:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            new_prompt_tokens = self._admit()
            cost = self.config.decode_step_s + self.config.prefill_token_s * new_prompt_tokens
            self._t = max(self._t, self.clock.now()) + cost
            self.lag_s = await self.clock.sleep_until(self._t)
            self._take_inbox_and_aborts()
            for live in list(self._running.values()):
                reason = live.step(self._t)
                self.stats.generation_tokens += 1
                if reason is not None:
                    self._finish(live, reason)

    def _admit(self) -> int:
        admitted_tokens = 0
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            live = self._waiting[0]
            if live.blocks_needed > self._free_blocks:
                break
            self._waiting.popleft()
            self._free_blocks -= live.blocks_needed
            live.blocks = live.blocks_needed
            live.scheduled = max(self._t, self.clock.now())
            self._running[live.request.request_id] = live
            self.stats.prompt_tokens += len(live.prompt_ids)
            admitted_tokens += len(live.prompt_ids)
        return admitted_tokens

    def _take_inbox_and_aborts(self) -> None:
        while self._inbox:
            self._waiting.append(self._inbox.popleft())
        if not self._abort_ids:
            return
        ids, self._abort_ids = self._abort_ids, set()
        for live in [*self._waiting, *self._running.values()]:
            if live.request.request_id in ids:
                if live in self._waiting:
                    self._waiting.remove(live)
                self._finish(live, FinishReason.ABORT)

    def _finish(self, live: LiveRequest, reason: FinishReason) -> None:
        rid = live.request.request_id
        self._running.pop(rid, None)
        self._live_ids.discard(rid)
        self._free_blocks += live.blocks
        live.blocks = 0
        live.handle.queue.put_nowait(live.final_chunk(reason, max(self._t, self.clock.now())))
        self.stats.record_finish(rid, reason)
        request_log(log, rid).info(
            "finished on %s: %s after %d tokens", self.name, reason.value, len(live.output_ids)
        )
