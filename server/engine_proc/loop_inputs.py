"""The engine loop's messages in, as a mixin of `EngineLoop` (server/engine_proc/loop.py),
which owns every attribute used here: the front ends' requests (each admitted or refused at
once, `_add`, and answered in one `Admissions` per front end), aborts, acks, a front end
gone, shutdown and the control messages (prefix-cache reset, LoRA, sleep mode, pausing
generation), drained
from the input socket in one `_service` call; and `_take_inbox`, which moves the accepted
requests into the scheduler and applies the aborts between steps.

Why a mixin: what arrives is handled between the steps of the single writer, kept out of
`loop.py` so that the step loop reads on its own (as `loop_outputs.py` keeps what leaves).
"""

from __future__ import annotations

import logging

import zmq

from server.engine.errors import ENGINE_FAULTED, EngineError, EngineFaulted, Paused, Unavailable
from server.engine.intake import admit
from server.engine.interface import FinishReason
from server.engine.logs import request_log
from server.engine_proc.loop_controls import Live
from server.engine_proc.pause import PAUSED_MESSAGE
from server.ipc import messages as m

# a refusal's error name -> vllm:admission_rejections' reason (max_waiting, doppelchip's own
# waiting-queue limit, counts as the queue limit vLLM names max_num_queued_reqs)
REJECTION_REASONS = {"Overloaded": "max_num_queued_reqs", "QueueOverflow": "max_num_queued_reqs",
                     "MaxQueuedTokens": "max_num_queued_tokens"}

log = logging.getLogger("doppelchip.engine")


class LoopInputs:
    """EngineLoop's `_service`, `_add`, `_take_inbox` and `_forget` (see the module
    docstring)."""

    def _service(self, timeout_ms: int | None) -> None:
        """Poll once (None: block until something arrives), then handle everything queued."""
        events = dict(self.poller.poll(timeout_ms))
        if self.connector is not None:
            self.connector.handle(events)
        for i, sock in enumerate(self.outputs):
            if events.get(sock, 0) & zmq.POLLOUT:
                self._flush(i)
        if self.kv_pub is not None and self.kv_pub.replay in events:
            self.kv_pub.service_replay()
        if not events.get(self.input, 0) & zmq.POLLIN:
            return
        replies: dict[int, list[m.Admission]] = {}
        rejected: dict[str, int] = {}
        while True:
            try:
                raw = self.input.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            msg = m.to_engine(raw)
            if isinstance(msg, m.AddRequest):
                answer = self._add(msg)
                if (reason := REJECTION_REASONS.get(answer.error or "")) is not None:
                    rejected[reason] = rejected.get(reason, 0) + 1
                replies.setdefault(msg.frontend, []).append(answer)
            elif isinstance(msg, m.Abort):
                reason = FinishReason.STOP if msg.reason == "stop" else FinishReason.ABORT
                for seq in msg.seqs:
                    if (key := f"{msg.frontend}:{seq}") in self.live:
                        self.aborts[key] = reason
            elif isinstance(msg, m.Ack):
                queue = self.unacked[msg.frontend]
                while queue and queue[0] <= msg.step:
                    queue.popleft()
            elif isinstance(msg, m.FrontendGone):
                for key, live in self.live.items():
                    if live.frontend == msg.frontend:
                        self.aborts[key] = FinishReason.ABORT
                self.unacked[msg.frontend].clear()
            elif isinstance(msg, m.Shutdown):
                self.stopping = True
            elif isinstance(msg, m.ResetPrefixCache):  # KV events (issue 13)
                self._reset_prefix_cache(msg)
            elif isinstance(msg, m.LoraOp):  # --- LoRA (issue 13) ---
                answer = (self.lora.handle(msg, self.deployment, self.rank) if self.lora else
                          m.LoraAnswer(self.deployment, self.rank, msg.op, 400,
                                       "BadRequestError", f"LoRA is not enabled on deployment "
                                       f"{self.name!r} (--enable-lora)"))
                self._send(msg.frontend, m.encode(answer))
            elif isinstance(msg, m.Sleep | m.WakeUp | m.ReleaseKvCache | m.Profile
                            | m.WeightVersion | m.FaultTolerance):
                answer = self._control(msg)
                if answer is not None:
                    replies.setdefault(msg.frontend, []).append(answer)
            elif isinstance(msg, m.Pause | m.Resume | m.Checkpoint):  # between steps
                self.pause.commands.append(msg)
        if replies:  # the waiting count a status query reads moves before the client knows
            self.stats.queued(self.num_queued(), rejected)
        for fe, items in replies.items():
            self._send(fe, m.encode(m.Admissions(self.deployment, self.rank, items)))

    def _add(self, msg: m.AddRequest) -> m.Admission:
        r = msg.request
        try:
            if msg.epoch != self.epoch:
                raise Unavailable(f"deployment {self.name!r} restarted; retry")
            if self.pause.rejects_new:  # vLLM's _reject_add_while_paused
                raise Paused(PAUSED_MESSAGE)
            if self.sentinel is not None and self.sentinel.status != "healthy":
                raise EngineFaulted(ENGINE_FAULTED)  # vLLM 0.34.0's fault tolerance
            if self.state != "ready":
                raise Unavailable(f"deployment {self.name!r} is {self.state}: "
                                  f"{'building its engine' if self.state == 'compiling' else ''}")
            params = r.kv_transfer_params if self.connector is not None else None
            remote_decode = bool(params and params.get("do_remote_decode"))
            req = admit(r, list(r.prompt_token_ids or ()),
                        1 if remote_decode else msg.max_tokens, msg.arrival,
                        limits=self.limits, num_queued=self.num_queued(),
                        free_seats=self.core.scheduler.free_seats,
                        in_flight=r.request_id in self.by_rid,
                        constraints=self.core.constraints, lora=self.core.lora,
                        queue=self.core.queue_limits,
                        unfinished=lambda: [live.req for live in self.live.values()])
        except EngineError as e:
            request_log(log, r.request_id).info("rejected on %s: %s", self.name, e)
            return m.Admission(msg.seq, type(e).__name__, str(e))
        req.request_id = f"{msg.frontend}:{msg.seq}"
        live = Live(req, msg.frontend, msg.seq, r.request_id)
        self.live[req.request_id] = live
        self.by_rid.add(r.request_id)
        req.hold_kv = remote_decode  # P/D: a prefill keeps its KV for the decode side
        if not (params and self.connector is not None
                and self.connector.start(live, req.request_id, params, req.num_prompt_tokens)):
            self.inbox.append(live)
        request_log(log, r.request_id).info(
            "queued on %s: %d prompt tokens, max_tokens=%d", self.name, req.num_prompt_tokens,
            req.sampling_params.max_tokens)
        return m.Admission(msg.seq)

    def _take_inbox(self) -> None:
        if (self.inbox and not self.sleep.sleeping and self.pending_sleep is None
                and not self.pause.paused):
            for live in self.inbox:
                if live.req.request_id not in self.aborts:
                    self._latest_arrival = max(self._latest_arrival, live.req.arrival_time)
                    self.core.add_request(live.req)
            self.inbox.clear()
        if self.aborts:
            aborts, self.aborts = self.aborts, {}
            for key, reason in aborts.items():
                if (live := self.live.get(key)) is not None:
                    if live in self.inbox:  # held while asleep
                        self.inbox.remove(live)
                    if self.connector is not None:
                        self.connector.abort(key)  # its KV not yet the scheduler's
                    self.core.scheduler.abort(live.req.request_id, reason)
                    self._forget(live, reason)

    def _forget(self, live: Live, reason: FinishReason) -> None:
        del self.live[live.req.request_id]
        self.by_rid.discard(live.rid)
        request_log(log, live.rid).info("finished on %s: %s after %d tokens", self.name,
                                        reason.value, live.req.num_output_tokens)
