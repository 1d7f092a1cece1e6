"""Autoscaling in virtual time: a Kubernetes-HPA-style controller over a pool of replicas
(issue 16; docs/AUTOSCALING.md).

Every `sync_period_s` the controller reads, from each ready replica's real `EngineCore`, the
metric a real autoscaler scrapes — `vllm:num_requests_waiting` (`waiting`),
`vllm:kv_cache_usage_perc` (`kv`) or the running requests (`running`, a custom target) —
and applies the HPA algorithm (kubernetes.io, "Horizontal Pod Autoscaling", Algorithm
details): desired = ceil(current × average / target), no change within the tolerance,
replicas still booting count as "missing metrics" (0 when scaling up, the target when scaling
down), then the behaviour: a stabilisation window per direction (the highest recommendation of
the last 300 s for scale-down, none for scale-up), the default scale-up rate limit
(max(100 %, 4 pods) per period) and min/max replicas.

Scale to zero (KEDA, keda.sh/docs/latest/reference/scaledobject-spec/): with `min = 0` the
pool's trigger is active while a replica's reading (or the number of requests the router
holds) is above `activation`; `cooldown_s` after its last active sync the pool goes to zero
(its replicas drain), and at zero the first active sync wakes one replica, which pays its cold
start while the router holds the requests (KEDA's HTTP add-on's interceptor); from one
replica on, the HPA decides (its own minimum being 1).

A replica is a slot of the cluster (`sim.virtual.run_cluster` runs them all). Its
state: off (not billed, gets nothing), booting (billed at idle power: a booting GPU is paid
for; gets nothing until its cold start is over), ready (routed to), draining (scaled in: no
new requests, finishes what it has, then off). This object is the loop's `control`: the
event loop calls `tick` at `next_at` and asks `bill_idle` before charging an idle core.
Its `choose` is the loop's router: over the ready slots (of the deployments serving the
request's class, with `--router slo-class`), with the router's admission if one is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from clients.conversation import Conversation
from server.engine.core import EngineCore
from sim.admission import Admission
from sim.autoscale_hpa import hpa_recommendation, metric_of, stabilised
from sim.autoscale_policy import AutoscalePolicy
from sim.pools import SLO_ROUTER
from sim.routers import kv_usage, make_router
from sim.virtual_types import REFUSED

OFF, BOOTING, READY, DRAINING = "off", "booting", "ready", "draining"
MAX_TICKS = 200_000  # syncs plus samples in a run: a bound on the loop (and the timeline)


@dataclass
class Group:
    """The slots of one deployment and, if it autoscales, its policy and history."""

    name: str
    slots: list[int]
    policy: AutoscalePolicy | None
    boot_s: float
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    last_active: float = 0.0  # scale to zero: the last sync its trigger was active
    classes: tuple[str, ...] = ()  # the SLO classes its deployment serves (none: any)
    role: str = "both"  # its deployment's P/D role (sim/autoscale_pd.py routes by it)

    def serves(self, slo_class: str, role: str = "both") -> bool:
        return (not self.classes or slo_class in self.classes) and self.role == role


class Autoscaler:
    """The control of a cluster run (see the module docstring). `groups` partition the
    slots; `initial[g]` slots of group g are ready at t = 0, the rest off. With an
    `admission`, the router sheds what no ready slot has room for (`refused` counts them)."""

    def __init__(self, cores: list[EngineCore], groups: list[Group], initial: list[int],
                 router: str, seed: int = 0, sample_s: float | None = None,
                 admission: Admission | None = None) -> None:
        self.cores, self.groups, self.router_name, self.seed = cores, groups, router, seed
        self.admission, self.refused = admission, 0
        # `--router slo-class`: a request goes to the ready slots of the deployments serving
        # its class, least outstanding first (as sim.pools does for a fixed fleet)
        self.by_class = router == SLO_ROUTER
        self.group_of = {k: g for g in groups for k in g.slots}
        self.state = [OFF] * len(cores)
        self.since = [0.0] * len(cores)  # when the state was entered
        self.ready_at: dict[int, float] = {}  # booting slot -> when it is ready
        self.billed_s = [0.0] * len(cores)
        for g, n in zip(groups, initial, strict=True):
            for k in g.slots[:n]:
                self.state[k] = READY
        periods = [g.policy.sync_period_s for g in groups if g.policy] or [sample_s or 15.0]
        self.period = min(periods)
        self.sample_s = sample_s or self.period
        self.next_sync, self.next_sample = 0.0, 0.0
        self.ticks = 0
        self.samples: list[dict] = []
        self._version, self._built = 0, -1
        self._ready: list[int] = []
        self._routers: dict[str, tuple[list[int], object]] = {}  # class -> its ready slots
        self.held: list[str] = []  # the classes of the requests the router holds (the loop's)
        # P/D (sim/autoscale_pd.py): the roles a request needs a replica of, and the loop's
        # outstanding requests per slot (a decode slot is busy while its KV is in transit)
        self.roles = tuple(sorted({g.role for g in groups}, reverse=True))
        self.outstanding: Sequence[int] = ()
        # the KEDA HTTP add-on's readiness timeout: the shortest a pool at zero sets
        self.hold_timeout_s = min((g.policy.readiness_timeout_s for g in groups
                                   if g.policy is not None and g.policy.readiness_timeout_s > 0),
                                  default=0.0)

    # ---- the event loop's side ------------------------------------------------------------
    @property
    def next_at(self) -> float:
        return min([self.next_sync, self.next_sample, *self.ready_at.values()])

    def tick(self, t: float) -> None:
        """Boots that are over, then (on the sync period) one HPA pass, then a sample."""
        self.ticks += 1
        if self.ticks > MAX_TICKS:
            raise ValueError(f"more than {MAX_TICKS} autoscaler syncs and timeline samples in "
                             f"the run (sync period {self.period:g} s, timeline every "
                             f"{self.sample_s:g} s): take longer ones")
        for k, at in sorted(self.ready_at.items()):
            if at <= t:
                del self.ready_at[k]
                self._enter(k, READY, t)
        if t >= self.next_sync:
            for g in self.groups:
                if g.policy is not None:
                    self._sync(g, t)
            self.next_sync = t + self.period
        if t >= self.next_sample:
            self.samples.append(self.sample(t))
            self.next_sample = t + self.sample_s

    def bill_idle(self, k: int, t: float) -> bool:
        """Is idle slot k paid for from `t` on? A draining slot with nothing left is off."""
        s = self.state[k]
        if s == DRAINING and not self._busy(k):
            self._enter(k, OFF, t)
            return False
        return s != OFF

    def _busy(self, k: int) -> bool:
        """Slot k still has work: requests, KV held for a decode replica to read, or a P/D
        request whose KV is on its way to it."""
        sched = self.cores[k].scheduler
        return (self.cores[k].has_unfinished() or bool(sched.held)
                or (bool(self.outstanding) and self.outstanding[k] > 0))

    def choose(self, prompt: Sequence[int], outstanding: Sequence[int],
               session: Conversation) -> int | None:
        """The router over the ready slots only (rebuilt when they change, as a gateway's
        endpoint list is); None (hold the request) while no slot is ready, which only a
        pool that scales to zero allows; REFUSED when the admission finds every ready slot
        saturated (`sim.admission`: GIE's filter and breaker over the endpoints it lists,
        the ready ones)."""
        if self._built != self._version:
            self._ready = [k for k, s in enumerate(self.state) if s == READY]
            self._routers = {}
            self._built = self._version
        cls = session.slo_class if self.by_class else ""
        if cls not in self._routers:
            ready = [k for k in self._ready if self.group_of[k].serves(cls)]
            name = "least-requests" if self.by_class else self.router_name
            self._routers[cls] = (ready, make_router(name, [self.cores[k] for k in ready],
                                                     self.seed + self._version)
                                  if ready else None)
        ready, policy = self._routers[cls]
        if not ready:
            if not self.can_wake(cls, "both"):
                raise RuntimeError("no ready replica to route to")
            return None
        i = policy.choose(prompt, [outstanding[k] for k in ready])  # type: ignore[union-attr]
        if self.admission is None:
            return ready[i]
        k = self.admission.pick(ready[i], ready, self.cores, outstanding, session.slo_class)
        if k is None:
            self.refused += 1
            return REFUSED
        return k

    def can_wake(self, cls: str, role: str) -> bool:
        """Can a slot of `role` serving `cls` become ready: one is booting, or its pool
        scales to zero (and wakes when activated)?"""
        return any(g.serves(cls, role) and ((g.policy is not None and g.policy.min == 0)
                                            or any(self.state[k] == BOOTING for k in g.slots))
                   for g in self.groups)

    def can_serve_held(self) -> bool:
        """Will any request held now be routed? Yes if, for each role it needs (P/D: both),
        a slot serving its class is ready or booting, or a pool at zero serving it will
        wake (more held for it than its activation threshold)."""
        return any(all(self._can_serve(cls, role) for role in self.roles)
                   for cls in (set(self.held) if self.by_class else {""}))

    def _can_serve(self, cls: str, role: str) -> bool:
        for g in self.groups:
            if not g.serves(cls, role):
                continue
            if any(self.state[k] in (READY, BOOTING) for k in g.slots):
                return True
            if (g.policy is not None and g.policy.min == 0
                    and self._held_for(g) > g.policy.activation):
                return True
        return False

    def _held_for(self, g: Group) -> int:
        """The held requests `g` could serve: those of its classes under `slo-class`."""
        if not self.by_class:
            return len(self.held)
        return sum(1 for c in self.held if g.serves(c, g.role))

    # ---- the controller -------------------------------------------------------------------
    def _enter(self, k: int, state: str, t: float) -> None:
        if self.state[k] != OFF:
            self.billed_s[k] += t - self.since[k]
        self.state[k], self.since[k] = state, t
        self._version += 1

    def _sync(self, g: Group, t: float) -> None:
        p = g.policy
        assert p is not None
        ready = [k for k in g.slots if self.state[k] == READY]
        booting = [k for k in g.slots if self.state[k] == BOOTING]
        current = len(ready) + len(booting)
        values = [metric_of(self.cores[k], p.metric) for k in ready]
        active = False
        if p.min == 0:  # KEDA: active while a reading (or the held requests) is above it
            active = (self._held_for(g) > p.activation
                      or any(v > p.activation for v in values))
            if active:
                g.last_active = t
            if current == 0:  # at zero: wake one replica once active; the HPA takes over
                if active:
                    spare = [k for k in g.slots if self.state[k] == OFF][:1]
                    for k in spare:
                        self._boot(k, t, g.boot_s)
                    g.events.append({"t": t, "from": 0, "to": len(spare)})
                return
        rec = hpa_recommendation(current, values, len(booting), p.target, p.tolerance)
        rec = max(p.min, 1, min(p.max, rec))  # the HPA's own minimum is 1 (KEDA's too)
        g.recommendations = [(at, r) for at, r in g.recommendations
                             if at > t - max(p.scale_down_window_s, p.scale_up_window_s)]
        desired = stabilised(g.recommendations, t, rec, current, p.scale_up_window_s,
                             p.scale_down_window_s)
        g.recommendations.append((t, rec))
        desired = min(desired, max(2 * current, current + 4))  # the default scale-up policy
        if p.min == 0 and not active and t - g.last_active >= p.cooldown_s:
            desired = 0  # KEDA: inactive for its cooldown period: 1 -> 0 (and any above)
        if desired > current:
            spare = [k for k in g.slots if self.state[k] == OFF][: desired - current]
            for k in spare:
                self._boot(k, t, g.boot_s)
            desired = current + len(spare)
        elif desired < current:  # booting ones first (the newest), then the newest ready
            victims = sorted(booting, key=lambda k: -self.since[k])
            victims += sorted(ready, key=lambda k: (-self.since[k], -k))
            for k in victims[: current - desired]:
                self.ready_at.pop(k, None)
                self._enter(k, DRAINING if self.state[k] == READY else OFF, t)
        if desired != current:
            g.events.append({"t": t, "from": current, "to": desired})

    def _boot(self, k: int, t: float, boot_s: float) -> None:
        reset = getattr(self.cores[k].scheduler.cache, "reset", None)
        if reset is not None:
            reset()  # a new pod starts with an empty prefix cache
        self._enter(k, BOOTING, t)
        self.ready_at[k] = t + boot_s

    def sample(self, t: float) -> dict:
        """The fleet now: replicas provisioned (booting, ready, draining) and ready, requests
        waiting and running, the ready replicas' mean KV usage, dollars so far."""
        ready = [k for k, s in enumerate(self.state) if s == READY]
        live = [k for k, s in enumerate(self.state) if s != OFF]
        return {
            "t": t,
            "provisioned": len(live),
            "ready": len(ready),
            "waiting": sum(self.cores[k].scheduler.num_waiting for k in live),
            "running": sum(self.cores[k].scheduler.num_running for k in live),
            "kv_usage": (sum(kv_usage(self.cores[k]) for k in ready) / len(ready)
                         if ready else 0.0),
            "dollars": sum(c.stats.dollars for c in self.cores),
        }

    def finish(self, t: float) -> None:
        """The run is over at `t`: close the billing of every slot still provisioned."""
        for k, s in enumerate(self.state):
            if s != OFF:
                self.billed_s[k] += t - self.since[k]
                self.since[k] = t


def boot_seconds(core: EngineCore, policy: AutoscalePolicy) -> float:
    """A new replica's cold start: `provision_s`, then `boot_s` if the policy sets it, else
    the device model's cold start (`devices.compile`): the weights' load time plus the engine
    build or ahead-of-time compile where the engine has one (TensorRT-LLM's build, JetStream's
    bucket programs, Groq's program). The replica then serves warm: what it compiled while
    booting is not compiled again."""
    if policy.boot_s is not None:
        return policy.provision_s + policy.boot_s
    return policy.provision_s + core.compiler.startup_seconds(True)
