"""The front end's input: every message the engines and the supervisor send it, on one ZeroMQ
PULL socket read from the event loop (no thread, no per-message task).

The hot path is `_step`: one engine step's tokens for this front end's requests. Per request
it only extends a list and records the step's time; detokenization waits for the stream's
consumer (except for requests with stop strings, which must stop at the step their stop
string appears). Request metrics are written once per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import zmq

from server.engine.interface import FinishReason
from server.frontend.deployment import DeploymentClient
from server.frontend.stats import FrontendStats
from server.ipc import messages as m

log = logging.getLogger("doppelchip.frontend")

_REASONS = {r.value: r for r in FinishReason}


class Receiver:
    def __init__(self, sock: zmq.Socket, clients: list[DeploymentClient], frontend: int,
                 stats: FrontendStats) -> None:
        self.sock, self.clients, self.frontend = sock, clients, frontend
        self.stats = stats
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._readable)
        self._loop.call_soon(self._readable)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.sock.getsockopt(zmq.FD))

    def _readable(self) -> None:
        sock = self.sock
        while True:  # ZMQ's FD is edge-triggered: drain it, then check for a late arrival
            try:
                raw = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                self._dispatch(m.to_frontend(raw))
            except Exception:
                log.exception("front end %d: bad message from an engine", self.frontend)
        if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN and self._loop is not None:
            self._loop.call_soon(self._readable)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, m.StepOutputs):
            self._step(msg)
        elif isinstance(msg, m.Admissions):
            client = self.clients[msg.deployment]
            for a in msg.items:
                pending = client.admissions.pop(a.seq, None)
                if pending is not None and not pending[0].done():
                    pending[0].set_result(a)
                elif ((control := client.controls.pop(a.seq, None)) is not None
                      and not control.done()):  # a sleep-mode command's answer (issue 13)
                    control.set_result(a)
        elif isinstance(msg, m.CacheReset):  # KV events (issue 13)
            fut = self.clients[msg.deployment].resets.get(msg.token)
            if fut is not None and not fut.done():
                fut.set_result(msg.ok)
        elif isinstance(msg, m.EngineDown):
            log.warning("deployment %s rank %d: %s", self.clients[msg.deployment].name,
                        msg.rank, msg.message)
            self.clients[msg.deployment].fail_rank(msg.rank, msg.message)
        elif isinstance(msg, m.LoraAnswer):  # --- LoRA (issue 13) ---
            self.clients[msg.deployment].lora.answered(msg)

    def _step(self, msg: m.StepOutputs) -> None:
        self.stats.begin()
        try:
            self._tokens(msg)
        finally:
            self.stats.end()
        if msg.want_ack and self._loop is not None:
            # after the streams this step woke have written their messages: a lagging engine
            # is paced by what this front end delivers, not by what it absorbs
            self._loop.call_soon(self._ack, msg.deployment, msg.rank, msg.step)

    def _ack(self, deployment: int, rank: int, step: int) -> None:
        with contextlib.suppress(zmq.Again):
            self.clients[deployment].sockets[rank].send(
                m.encode(m.Ack(self.frontend, step)), zmq.NOBLOCK)

    def _tokens(self, msg: m.StepOutputs) -> None:
        client = self.clients[msg.deployment]
        streams = client.streams
        t = msg.t_end
        for seq, cached in msg.first_scheduled:
            if (st := streams.get(seq)) is not None:
                st.first_scheduled = msg.t_start
                st.cached = cached
        for seq, n in msg.external:  # P/D (issue 13): prompt KV transferred in
            if (st := streams.get(seq)) is not None:
                st.external = n
        for seq, n in msg.jumped:
            if (st := streams.get(seq)) is not None:
                st.jumped += n
        for seq in msg.preempted:
            if (st := streams.get(seq)) is not None:
                st.preemptions += 1
        generation = prompt = cached = external = 0
        ttfts: list[float] = []
        streaming: list[bool] = []  # each first token's request asked a stream (SGLang's)
        itl: list[float] = []
        itl_n: list[int] = []
        tokens, pos = msg.tokens, 0
        stopped = []
        version = msg.weight_version
        for seq, n in zip(msg.seqs, msg.counts, strict=True):
            st = streams.get(seq)
            if st is None or not st.logged:  # gone, or a health probe the metrics skip
                if st is not None and st.push(tokens[pos : pos + n], t):
                    stopped.append(st)
                pos += n
                continue
            if st.versions is not None:  # vLLM's return_weight_versions
                st.track_weight_version(version)
            prev = st.last_token
            if prev is None:
                ttfts.append(t - st.arrival)
                streaming.append(st.request.stream)
                prompt += len(st.out.prompt_ids)
                cached += st.cached
                external += st.external
            else:
                itl.append((t - prev) / n)
                itl_n.append(n)
            generation += n
            if st.push(tokens[pos : pos + n] if n > 1 else [tokens[pos]], t):
                stopped.append(st)
            pos += n
        for st in stopped:  # a stop string matched: the engine may free the request
            client.tell_engine(st, "stop")
            client.finished(st, FinishReason.STOP)
        for f in msg.finished:
            if (st := streams.get(f.seq)) is not None:
                reason = _REASONS[f.reason]
                if st.request.pooling is not None and st.first_token is None \
                        and reason is FinishReason.STOP:  # the pooled vector: its one output
                    st.first_token = st.last_token = t
                    if st.logged:
                        ttfts.append(t - st.arrival)
                        streaming.append(st.request.stream)
                        prompt += len(st.out.prompt_ids)
                        cached += st.cached
                        external += st.external
                st.finish(reason, f.stop_token_id, f.kv_transfer_params, f.spec_decode_metrics)
                client.finished(st, reason)  # (after: its stats read the tally)
        client.blocks[msg.rank].step(generation, prompt, cached, ttfts, itl, itl_n, external,
                                     streaming)
