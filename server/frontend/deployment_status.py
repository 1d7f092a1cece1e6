"""A deployment's status as a front end sees it, read from its engines' stats files (reading
never waits on an engine): `EngineView` reads one rank's file; `DeploymentStatusView`, a mixin
of `DeploymentClient` (server/frontend/deployment.py, which owns `views`, `info` and `lora`),
joins the ranks into the deployment's state, capacity and load.
"""

from __future__ import annotations

from server.engine.intake import dp_score
from server.engine.interface import Capacity, DeploymentState, DeploymentStatus, LoraAdapterStatus
from server.frontend.lora import LoraView
from server.ipc.deployment import DeploymentInfo
from server.stats.layout import Layout
from server.stats.schema import STATE_CODES, engine_metrics
from server.stats.shm import StatsFile


class EngineView:
    """Read side of one engine's stats file: state, epoch, load, KV."""

    def __init__(self, path, info: DeploymentInfo) -> None:
        self.path, self.info = path, info
        self.layout = Layout(engine_metrics(info))
        self._file: StatsFile | None = None

    def read(self):
        if self._file is None:
            self._file = StatsFile(self.path, self.layout.size)
        return self._file.snapshot()

    def value(self, values, name: str) -> float:
        return float(values[self.layout.slot(name)])


class DeploymentStatusView:
    """DeploymentClient's status methods (see the module docstring)."""

    views: list[EngineView]
    info: DeploymentInfo
    lora: LoraView

    def rank_state(self, rank: int) -> tuple[DeploymentState, str, int, float]:
        """(state, message, epoch, load) of one rank, from its stats file; the load is vLLM's
        score for balancing over data-parallel ranks (`intake.dp_score`)."""
        view = self.views[rank]
        values, text = view.read()
        state = DeploymentState(STATE_CODES[int(view.value(values, "_state"))])
        waiting = view.value(values, "vllm:num_requests_waiting")
        total = view.info.capacity.kv_blocks_total
        usage = view.value(values, "_kv_used") / total if total else 0.0
        load = dp_score(view.value(values, "vllm:num_requests_running") + waiting, waiting,
                        usage)
        return state, text, int(view.value(values, "_epoch")), load

    def _views(self, ranks: list[int] | None) -> list[EngineView]:
        """The views of `ranks` (indexes), or of every rank."""
        return self.views if ranks is None else [self.views[r] for r in ranks]

    def status(self, ranks: list[int] | None = None) -> DeploymentStatus:
        """The deployment's status over its ranks (`ranks`: only those, by index)."""
        views = self._views(ranks)
        running = waiting = free = 0
        states = []
        for view in views:
            values, text = view.read()
            states.append((STATE_CODES[int(view.value(values, "_state"))], text))
            running += int(view.value(values, "vllm:num_requests_running"))
            waiting += int(view.value(values, "vllm:num_requests_waiting"))
            free += int(view.value(values, "_kv_free"))
        order = ("ready", "compiling", "draining", "failed")
        state, message = min(states, key=lambda s: order.index(s[0]))
        i, c = self.info, self.info.capacity
        n = len(views)
        capacity = Capacity(c.kv_blocks_total * n, free, c.block_size, c.max_model_len,
                            c.max_num_seqs, c.max_concurrency * n, c.max_waiting)
        return DeploymentStatus(
            name=i.name, model=i.model, quant=i.quant, engine=i.engine, chip=i.chip,
            chip_count=i.chip_count, tensor_parallel=i.tensor_parallel,
            pipeline_parallel=i.pipeline_parallel, state=DeploymentState(state),
            state_message=message, capacity=capacity, num_running=running,
            num_waiting=waiting, adapters=tuple(  # --- LoRA (issue 13) ---
                LoraAdapterStatus(a.name, a.id, a.path, a.base_model_name, a.rank)
                for a in self.lora.adapters()))

    def generated_tokens(self, ranks: list[int] | None = None) -> int:
        """Output tokens every rank (`ranks`: those) has generated so far (all front ends)."""
        total = 0
        for view in self._views(ranks):
            values, _ = view.read()
            total += int(view.value(values, "_generated"))
        return total

    def is_ready(self) -> bool:
        return any(self.rank_state(r)[0] is DeploymentState.READY for r in range(len(self.views)))

    def is_sleeping(self) -> bool:
        """Whether any rank is asleep (vllm:engine_sleep_state{sleep_state="awake"} == 0)."""
        for view in self.views:
            values, _ = view.read()
            if not values[view.layout.slot("vllm:engine_sleep_state", "awake")]:
                return True
        return False

    def is_paused(self) -> bool:
        """Whether any rank's scheduler is paused: by `/pause` (its `_paused` slot) or by
        sleeping, as vLLM's `is_scheduler_paused` answers."""
        for view in self.views:
            values, _ = view.read()
            if values[view.layout.slot("_paused")]:
                return True
        return self.is_sleeping()
