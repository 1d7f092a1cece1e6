"""A front end's view of one deployment's LoRA adapters, and its runtime load/unload calls.

Why here: the engine core owns the adapters (it schedules and prices them); a front end only
needs their names (to resolve a request's `model`, list `/v1/models`, answer
ListDeployments) and a way to ask every data-parallel rank to load or unload one. The names
come from the engine's adapter file (`server/engine_proc/lora.py`), re-read when it changes;
every front end sees the same adapters, whichever one took the load request.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import msgspec
import zmq

from server.engine.lora import LoraAdapter
from server.ipc import messages as m
from server.stats.lora import adapters_of, lora_file, read_lora_file

_OPS = itertools.count(1)
OP_TIMEOUT_S = 30.0


class LoraView:
    def __init__(self, stats_paths: list[Path], max_loras: int, frontend: int) -> None:
        self.paths = [lora_file(p) for p in stats_paths]
        self.enabled = max_loras > 0
        self.max_loras = max_loras
        self.frontend = frontend
        self._key: tuple[int, int] | None = None
        self._adapters: list[LoraAdapter] = []
        self.pending: dict[tuple[int, int], asyncio.Future[m.LoraAnswer]] = {}

    def adapters(self) -> list[LoraAdapter]:
        """The adapters rank 0 serves (every rank is given the same loads)."""
        if not self.enabled:
            return []
        try:
            st = os.stat(self.paths[0])
        except OSError:
            return []
        key = (st.st_ino, st.st_mtime_ns)
        if key != self._key:
            self._adapters = adapters_of(read_lora_file(self.paths[0]))
            self._key = key
        return self._adapters

    def get(self, name: str) -> LoraAdapter | None:
        return next((a for a in self.adapters() if a.name == name), None)

    def info_rows(self) -> list[list]:
        """Every rank's (running, waiting, unix time) combinations (vllm:lora_requests_info)."""
        rows: list[list] = []
        for path in self.paths:
            rows.extend(read_lora_file(path).get("info", []))
        return rows

    async def op(self, sockets: list[zmq.Socket], kind: str, name: str, path: str = "",
                 rank: int | None = None, base_model_name: str = "") -> m.LoraAnswer:
        """Ask every rank to load/unload; the first refusal, else rank 0's success."""
        op = next(_OPS)
        loop = asyncio.get_running_loop()
        futures = []
        for r, sock in enumerate(sockets):
            fut: asyncio.Future[m.LoraAnswer] = loop.create_future()
            self.pending[(r, op)] = fut
            futures.append(fut)
            try:
                sock.send(m.encode(m.LoraOp(self.frontend, op, kind, name, path, rank,
                                            base_model_name)), zmq.NOBLOCK)
            except zmq.Again:
                fut.set_result(m.LoraAnswer(0, r, op, 503, "ServiceUnavailable",
                                            "the deployment's engine process is not reachable"))
        try:
            answers = await asyncio.wait_for(asyncio.gather(*futures), OP_TIMEOUT_S)
        except TimeoutError:
            answers = [m.LoraAnswer(0, 0, op, 503, "ServiceUnavailable",
                                    "the deployment's engine did not answer")]
        finally:
            for r in range(len(sockets)):
                self.pending.pop((r, op), None)
        return next((a for a in answers if a.status != 200), answers[0])

    def answered(self, msg: m.LoraAnswer) -> None:
        fut = self.pending.get((msg.rank, msg.op))
        if fut is not None and not fut.done():
            fut.set_result(msg)


def tag(client, model: str | None, request):
    """`request` (an EngineRequest) for the adapter `model` names on `client`, if it names one
    and not a base model's served name (vLLM: a request's `model` selects the adapter)."""
    info = client.info
    if not model or model in (info.served_model_names or (info.model,)) \
            or client.lora.get(model) is None:
        return request
    return msgspec.structs.replace(request, lora_name=model)
