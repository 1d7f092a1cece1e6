"""Autoscaled disaggregated P/D pools in virtual time (issue 16; docs/AUTOSCALING.md).

Why it exists: llm-d scales its prefill and decode pools separately (one HPA or KEDA object
per role's Deployment), and a planner asks how that behaves through a peak. A P/D fleet's
placement is `sim.pools.FleetDispatch`'s (a prefill and a decode replica per request at its
arrival, each by the `--router` policy within its role, admission, the KV links); the
autoscaler (`sim.autoscale.Autoscaler`) decides which slots are ready. `ScaledDispatch` joins
the two: the same placement over the ready slots only, its routers rebuilt whenever the ready
set changes (as a gateway's endpoint list is), and a request held at the router (`HELD`) while
either role has no ready slot but one is booting or its pool can wake from zero — then routed
again after the control's next tick, as a request held for an aggregated pool at zero is.

A slot that drains (scaled in) gets no new request; it goes off once it has nothing left: no
request, no KV held for a decode replica, no request whose KV is on its way to it
(`Autoscaler._busy`).
"""

from __future__ import annotations

from collections.abc import Sequence

from clients.conversation import Conversation
from sim.admission import Admission
from sim.autoscale import READY, Autoscaler
from sim.pools import FleetDispatch
from sim.virtual_types import HELD


class ScaledDispatch(FleetDispatch):
    """`FleetDispatch` over the slots `control` has ready (see the module docstring)."""

    def __init__(self, replicas: Sequence, router: str, control: Autoscaler, seed: int = 0,
                 admission: Admission | None = None) -> None:
        super().__init__(replicas, router, seed, admission)
        self.control, self.base_seed = control, seed
        self._version = -1

    def _routable(self, ks: list[int]) -> list[int]:
        state = self.control.state
        return [k for k in ks if state[k] == READY]

    def place(self, prompt: Sequence[int], outstanding: Sequence[int],
              session: Conversation) -> tuple[int, int | None] | None:
        control = self.control
        control.outstanding = outstanding  # the loop's list: read when a slot drains
        if self._version != control._version:  # the ready slots changed: new routers
            self.groups, self._version = {}, control._version
            self.seed = self.base_seed + control._version
        cls = session.slo_class if self.by_class else ""
        for role in self._roles():
            if not self._routable(self._members(cls, role)):
                if not control.can_wake(cls, role):
                    raise RuntimeError(f"no ready {role} replica to route to")
                return HELD
        return super().place(prompt, outstanding, session)

