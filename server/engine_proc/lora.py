"""The engine core's LoRA side: runtime load/unload requests, and the adapter file the front
ends read (the adapters for `/v1/models`, model names and ListDeployments; the running and
waiting adapters for `vllm:lora_requests_info`).

Why a file and not the stats array: adapter names are strings and their number changes. The
engine is its only writer; it replaces the file atomically (write, then rename) when the
adapters or the running/waiting sets change, and at most once a second while they hold, so
the newest combination's timestamp keeps moving as vLLM's `set_to_current_time()` does every
step. Readers re-read it when its mtime changes.

`vllm:lora_requests_info` as vLLM exports it (docs/LORA.md): one sample per combination of
(running adapters, waiting adapters) ever seen, each valued with the Unix time it was last
current; names joined by "," in first-seen order. vLLM never removes a combination; here the
256 most recent are kept (a bound vLLM does not have, so a long-lived pod's scrape stays small).
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from pathlib import Path

from server.engine.core import EngineCore
from server.engine.lora import LoraError
from server.engine.request import Request
from server.ipc import messages as m
from server.stats.lora import lora_file  # noqa: F401 - re-exported for the loop

MAX_COMBINATIONS = 256
REFRESH_S = 1.0


class LoraPublisher:
    def __init__(self, core: EngineCore, path: Path) -> None:
        assert core.lora is not None
        self.core, self.lora, self.path = core, core.lora, path
        self.seen: dict[str, None] = {}  # adapter names in first-seen order
        self.combos: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.current: tuple[str, str] | None = None
        self._written = 0.0
        self._version = -1
        self.write()

    def handle(self, op: m.LoraOp, deployment: int, rank: int) -> m.LoraAnswer:
        """Apply a runtime load/unload; the answer carries vLLM's status and message."""
        try:
            if op.kind == "load":
                self.lora.load(op.name, op.path, op.rank, op.base_model_name)
                message = f"Success: LoRA adapter '{op.name}' added successfully."
            elif op.kind == "unload":
                self.lora.unload(op.name)
                message = f"Success: LoRA adapter '{op.name}' removed successfully."
            else:
                raise LoraError(f"unknown LoRA operation {op.kind!r}")
        except LoraError as e:
            return m.LoraAnswer(deployment, rank, op.op, e.status, e.kind, str(e))
        self.write()
        return m.LoraAnswer(deployment, rank, op.op, 200, "", message)

    def _names(self, reqs) -> str:
        by_id, out = self.lora.by_id, {}
        for r in reqs:
            if r.lora_id and (a := by_id.get(r.lora_id)) is not None:
                self.seen.setdefault(a.name, None)
                out[a.name] = None
        return ",".join(n for n in self.seen if n in out)

    def step(self, inbox: list[Request]) -> None:
        """After a step: note the running and waiting adapters (rewrite the file if they
        changed, or a second has passed)."""
        sched = self.core.scheduler
        combo = (self._names(sched.running), self._names([*sched.waiting, *inbox]))
        now = time.time()
        if combo != self.current or now - self._written >= REFRESH_S \
                or self.lora.version != self._version:
            self.current = combo
            self.combos[combo] = now
            self.combos.move_to_end(combo)
            while len(self.combos) > MAX_COMBINATIONS:
                self.combos.popitem(last=False)
            self.write(now)

    def write(self, now: float | None = None) -> None:
        self._written = now or time.time()
        self._version = self.lora.version
        doc = {"max_lora": self.lora.config.max_loras,
               "adapters": [[a.name, a.id, a.path, a.base_model_name, a.rank]
                            for a in self.lora.listing()],
               "info": [[r, w, t] for (r, w), t in self.combos.items()]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)
