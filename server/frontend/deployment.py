"""A front end's handle on one deployment: its engine processes (one per data-parallel rank),
their status, and the requests this front end has in flight on them.

`submit()` checks the request against the deployment's static limits here (tokenize, context,
KV pool: no round trip to a busy engine for a bad request), sends it to the least-loaded
ready rank, and awaits the engine's admission (waiting-queue limit, constraint compile) —
so a refusal is still a status code before anything streams. `abort()` is safe for any
stream, any number of times. Status and state come from the engines' stats files
(`deployment_status.py`): reading them never waits on an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import NoReturn

import msgspec
import zmq

from server.engine.errors import AlreadyExists, InvalidRequest, NotPlaced, Unavailable
from server.engine.intake import check_request, check_sizes
from server.engine.interface import DeploymentState, EngineRequest, FinishReason
from server.engine.output import RequestOutput, request_timings
from server.engine.tokenizer import Tokenizer
from server.frontend.deployment_controls import ERRORS, SEQ, DeploymentControls
from server.frontend.deployment_status import DeploymentStatusView, EngineView
from server.frontend.lora import LoraView
from server.frontend.pacing import UNPACED, LoopPacer
from server.frontend.stats import FrontendStats
from server.frontend.stream import RequestStream
from server.ipc import messages as m
from server.ipc.deployment import DeploymentInfo
from server.ipc.paths import RunDir

INLINE_TOKENIZE_CHARS = 8192  # longer prompts are tokenized in a thread, off the event loop


class DeploymentClient(DeploymentStatusView, DeploymentControls):
    def __init__(self, index: int, infos: list[DeploymentInfo], *, frontend: int,
                 run_dir: RunDir, ctx: zmq.Context, tokenizer: Tokenizer, stream_interval: int,
                 clock: Callable[[], float], stats: FrontendStats,
                 pacer: LoopPacer = UNPACED) -> None:
        self.index, self.infos = index, infos
        self.info = infos[0]
        self.name = self.info.name
        self.frontend, self.tokenizer = frontend, tokenizer
        self.stream_interval, self.clock = stream_interval, clock
        self.pacer = pacer  # the front end's coalescing under overload (server.frontend.pacing)
        self.stats = stats  # this front end's request metrics
        self.blocks = {i.rank: stats.blocks[(index, i.rank)] for i in infos}
        self.limits = self.info.limits
        self.views = [EngineView(run_dir.engine_stats(index, i.rank), i) for i in infos]
        self.sockets = []
        for info in infos:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.IMMEDIATE, 1)  # never queue for an engine that is not there
            # nor refuse a burst for one that is: with zmq's default high-water mark (1,000
            # messages) a burst of 3,000 requests met a busy engine's full pipe and 8 were
            # answered UNAVAILABLE "not reachable" instead of the engine's admission control
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.RECONNECT_IVL, 10)
            s.connect(run_dir.engine_input(index, info.rank))
            self.sockets.append(s)
        self.streams: dict[int, RequestStream] = {}
        self._ids: dict[str, int] = {}  # client request id -> its streams in flight here
        self.admissions: dict[int, tuple[asyncio.Future[m.Admission], RequestStream]] = {}
        self._turn = 0  # round robin among equally loaded ranks
        self.resets: dict[int, asyncio.Future[bool]] = {}  # KV events (issue 13)
        self._reset_token = 0
        # --- LoRA (issue 13) ---
        self.lora = LoraView([run_dir.engine_stats(index, i.rank) for i in infos],
                             self.info.max_loras, frontend)
        self.controls: dict[int, asyncio.Future[m.Admission]] = {}  # sleep mode (issue 13)
        self.faults = None  # request-level faults (issue 13): a frontend.faults.RequestFaults

    def claim(self, client_id: str) -> None:
        """Reserve a client's request id for one request (its n streams, `submit(...,
        client_id=)`), or AlreadyExists while a request under that id is in flight here. The
        id is free again when its last stream ends, or at `unclaim_if_idle` if none began."""
        if client_id in self._ids:
            raise AlreadyExists(f"request id {client_id!r} is already in flight on deployment "
                                f"{self.name!r}")
        self._ids[client_id] = 0

    def unclaim_if_idle(self, client_id: str) -> None:
        if self._ids.get(client_id) == 0:
            del self._ids[client_id]

    def _forget(self, seq: int) -> RequestStream | None:
        """Stop routing `seq` (however it ended); its client id is released with its last
        stream. The stream, or None if it had already ended."""
        stream = self.streams.pop(seq, None)
        self.admissions.pop(seq, None)
        if stream is not None and (cid := stream.client_id) is not None:
            left = self._ids.get(cid, 1) - 1
            if left > 0:
                self._ids[cid] = left
            else:
                self._ids.pop(cid, None)
        return stream

    def find(self, request_id: str) -> list[RequestStream]:
        """This front end's streams in flight with this client request id."""
        return [s for s in self.streams.values() if s.request_id == request_id]

    # ---- requests ---------------------------------------------------------------------------
    def _pick_rank(self, pinned: int | None = None) -> tuple[int, int]:
        """The least-loaded ready rank and its epoch, or the error a client should see. Load
        is what the rank reports (every front end's requests) plus this front end's requests
        it has not answered yet; ties go round robin (vLLM's data-parallel balancing).
        `pinned`: the rank a router chose (vLLM's data_parallel_rank), checked as vLLM's
        input processor checks it."""
        if pinned is not None:
            if not 0 <= pinned < len(self.views):
                raise InvalidRequest(f"data_parallel_rank {pinned} is out of range "
                                     f"[0, {len(self.views)}).")
            state, text, epoch, _ = self.rank_state(pinned)
            if state is not DeploymentState.READY:
                self._refuse(state, text)
            return pinned, epoch
        if len(self.views) == 1:
            state, text, epoch, _ = self.rank_state(0)
            if state is DeploymentState.READY:
                return 0, epoch
            self._refuse(state, text)
        pending = [0] * len(self.views)
        for _, stream in self.admissions.values():
            pending[stream.rank] += 1
        ready: list[tuple[float, int, int]] = []
        worst: tuple[DeploymentState, str] | None = None
        for rank in range(len(self.views)):
            state, text, epoch, load = self.rank_state(rank)
            if state is DeploymentState.READY:
                ready.append((load + pending[rank], rank, epoch))
            else:
                worst = (state, text)
        if ready:
            low = min(r[0] for r in ready)
            ties = [r for r in ready if r[0] == low]
            self._turn += 1
            _, rank, epoch = ties[self._turn % len(ties)]
            return rank, epoch
        self._refuse(*(worst or (DeploymentState.FAILED, "")))

    def _refuse(self, state: DeploymentState, text: str) -> NoReturn:
        if not self.info.placed:
            raise NotPlaced(f"deployment {self.name!r} could not be placed: {self.info.failure}")
        raise Unavailable(f"deployment {self.name!r} is {state.value}: {text}")

    async def submit(self, request: EngineRequest, client_id: str | None = None
                     ) -> RequestStream:
        """Check, send, await admission; the stream to iterate, or a typed EngineError.
        `client_id`: the id `claim()` reserved, held until this stream ends."""
        rank, epoch = self._pick_rank(request.data_parallel_rank)
        check_sizes(request, self.limits)  # before any work: a huge prompt is refused at once
        text = request.prompt_text
        if text is not None and len(text) > INLINE_TOKENIZE_CHARS:  # off the event loop
            tokenized = await asyncio.to_thread(self.tokenizer.encode_unlocked, text)

            def encode(_: str) -> list[int]:
                return tokenized
        else:
            encode = self.tokenizer.encode
        ids, max_tokens = check_request(request, self.limits, encode)
        arrival = self.clock()
        seq = next(SEQ)
        prompt = tuple(ids)
        stream = RequestStream(
            request, RequestOutput(request, prompt, self.tokenizer), seq=seq,
            deployment=self.index, rank=rank, arrival=arrival, interval=self.stream_interval,
            clock=self.clock, pacer=self.pacer)
        wire = msgspec.structs.replace(request, prompt_text=None, prompt_token_ids=prompt)
        future: asyncio.Future[m.Admission] = asyncio.get_running_loop().create_future()
        self.admissions[seq] = (future, stream)
        self.streams[seq] = stream
        if client_id is not None:
            stream.client_id = client_id
            self._ids[client_id] = self._ids.get(client_id, 0) + 1
        try:
            self.sockets[rank].send(m.encode(m.AddRequest(
                self.frontend, seq, epoch, arrival, max_tokens, wire)), zmq.NOBLOCK)
        except zmq.Again:
            self._drop(seq)
            raise Unavailable(f"deployment {self.name!r}: its engine process is not "
                              "reachable") from None
        try:
            answer = await future
        except asyncio.CancelledError:  # the client left while waiting: free it in the engine
            self.abort(stream)
            raise
        if answer.error:
            self._drop(seq)
            raise ERRORS.get(answer.error, Unavailable)(answer.message)
        return stream

    def _drop(self, seq: int) -> None:
        self._forget(seq)

    def abort(self, stream: RequestStream) -> None:
        """End the request in its engine (client cancel, deadline, failed write, drain) and
        count it as aborted — unless it already ended. Safe to call any number of times."""
        if self._forget(stream.seq) is None:
            return
        self.tell_engine(stream, "abort")
        self.record_finish(stream, FinishReason.ABORT)

    def cancel(self, stream: RequestStream) -> None:
        """End a request someone other than its client ended (an Abort RPC, `/abort_requests`,
        a drain's grace running out): `abort` it, and end its stream with finish reason abort,
        which its reader then answers."""
        self.abort(stream)
        stream.finish(FinishReason.ABORT)

    def tell_engine(self, stream: RequestStream, reason: str) -> None:
        """Ask the engine to free the request (reason "stop": a stop string matched)."""
        with contextlib.suppress(zmq.Again):  # the engine is gone: nothing holds it there
            self.sockets[stream.rank].send(
                m.encode(m.Abort(self.frontend, [stream.seq], reason)), zmq.NOBLOCK)

    def finished(self, stream: RequestStream, reason: FinishReason) -> None:
        """The request ended (engine finish or stop string): stop routing it, count it."""
        if self._forget(stream.seq) is not None:
            self.record_finish(stream, reason)

    def record_finish(self, stream: RequestStream, reason: FinishReason) -> None:
        if not stream.logged:  # SGLang's health probe (log_metrics=False)
            return
        tm = request_timings(stream.arrival, stream.first_scheduled, stream.first_token,
                             stream.last_token, self.clock())
        self.stats.begin()
        self.blocks[stream.rank].finished(
            reason.value, tm.e2e_s, tm.queue_s, tm.prefill_s, tm.decode_s,
            len(stream.out.prompt_ids), stream.n_out, stream.request.sampling.max_tokens,
            stream.cached, stream.preemptions, stream=stream.request.stream,
            structured=stream.request.constraint is not None,
            verify_calls=spec.num_spec_steps if (spec := stream.spec_decode_metrics) else 0)
        self.stats.end()

    def fail_rank(self, rank: int, message: str) -> None:
        """The engine process of `rank` died: every request on it ends with `message`."""
        for seq, stream in list(self.streams.items()):
            if stream.rank == rank:
                pending = self.admissions.get(seq)
                self._forget(seq)
                if pending is not None:
                    if not pending[0].done():
                        pending[0].set_result(m.Admission(seq, "Unavailable", message))
                    continue
                self.record_finish(stream, FinishReason.ERROR)
                stream.fail(message)
        for seq, control in list(self.controls.items()):  # a command no engine will answer
            if not control.done():
                control.set_result(m.Admission(seq, "Unavailable", message))
            del self.controls[seq]
