"""Pools of a virtual-time fleet (issue 16): a pool is one fleet-file deployment (its
`replicas` copies) with a `role` in disaggregated serving and the SLO classes it serves.

Why it exists: the event loop asks one object where an arriving turn goes
(`sim.virtual.Dispatch`); the answer joins four fleet-level rules the engine core
knows nothing of, all decided here before a request touches a replica:

- SLO classes: with `--router slo-class` a request goes to the pools listing its class (pools
  listing none serve any class and untagged requests), least outstanding among their
  replicas; a class no pool serves is an error before the run (`check_classes`).
- roles: a fleet is aggregated (every pool "both") or disaggregated (prefill and decode pools,
  no "both"); a disaggregated request is placed on a prefill and a decode replica at once, at
  its arrival (llm-d's scheduler picks both), each by the `--router` policy within its role.
- admission (`sim.admission`): the pick must have room, else another replica of its group,
  else the request is refused.
- the KV transfer of a P/D request (`sim.pd.KvLinks`).

Each group of replicas (a role, or a class and a role) has its own policy instance over its
own cores, so round robin, p2c and prefix-aware behave within a group as over a whole fleet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clients.conversation import Conversation
from sim.admission import Admission
from sim.pd import KvLinks, link_name
from sim.routers import make_router

SLO_ROUTER = "slo-class"  # the class-aware policy: least outstanding within the class's pools


@dataclass(frozen=True)
class Pool:
    name: str
    role: str  # prefill | decode | both
    classes: tuple[str, ...]  # served SLO classes (none: any)
    replicas: tuple[int, ...]  # indexes into the fleet's replicas

    def serves(self, slo_class: str) -> bool:
        return not self.classes or slo_class in self.classes


class FleetError(ValueError):
    """The fleet's pools cannot serve the run as asked; the message says why."""


def unserved(slo_class: str, role: str = "both") -> FleetError:
    """The error for a class (of a role) no pool serves."""
    what = f"SLO class {slo_class!r}" if slo_class else "untagged requests (no SLO class)"
    return FleetError(f"{what}: no {'' if role == 'both' else role + ' '}pool serves it (give "
                      "a pool slo_classes = [...] listing it, or one without slo_classes)")


def pools_of(replicas: Sequence) -> list[Pool]:
    """The pools of `replicas` (sim.cluster.Replica), one per deployment, in fleet order."""
    order: dict[str, list[int]] = {}
    for k, r in enumerate(replicas):
        order.setdefault(r.options.name, []).append(k)
    out = []
    for name, ks in order.items():
        o = replicas[ks[0]].options
        out.append(Pool(name, o.role, tuple(o.slo_classes), tuple(ks)))
    return out


def disaggregated(pools: Sequence[Pool]) -> bool:
    """True for a P/D fleet; FleetError for a fleet mixing roles in a way no request can use."""
    roles = {p.role for p in pools}
    if roles <= {"both"}:
        return False
    if not {"prefill", "decode"} <= roles:
        need = "decode" if "prefill" in roles else "prefill"
        raise FleetError(f"a fleet with {' and '.join(sorted(roles - {'both'}))} pools needs "
                         f"a {need} pool too (role = \"{need}\")")
    if "both" in roles:
        both = [p.name for p in pools if p.role == "both"]
        raise FleetError(f"a disaggregated fleet has prefill and decode pools only; give "
                         f"{', '.join(both)} a role (\"prefill\" or \"decode\")")
    return True


class FleetDispatch:
    """The `Dispatch` of a fleet: pools, the router policy, admission and KV links."""

    def __init__(self, replicas: Sequence, router: str, seed: int = 0,
                 admission: Admission | None = None) -> None:
        self.replicas = list(replicas)
        self.cores = [r.core for r in self.replicas]
        self.pools = pools_of(self.replicas)
        self.pd = disaggregated(self.pools)
        self.prefill_cores = [k for p in self.pools if p.role == "prefill" for k in p.replicas]
        if self.pd:
            models = {(r.options.model, r.options.quant) for r in self.replicas}
            if len(models) > 1:
                raise FleetError("prefill and decode pools must serve the same model and "
                                 "quantisation (their KV must be interchangeable)")
        self.router, self.seed, self.admission = router, seed, admission
        self.by_class = router == SLO_ROUTER
        self.groups: dict[tuple[str, str], tuple[list[int], object]] = {}
        self.links = KvLinks(self.cores, [link_name(r.options.kv_transfer_config)
                                          for r in self.replicas])
        self.refused = 0

    def check_classes(self, classes: set[str]) -> None:
        """Every class of the run has a pool (of each role it needs), or FleetError."""
        if not self.by_class:
            return
        for c in sorted(classes):
            for role in self._roles():
                if not self._members(c, role):
                    raise unserved(c, role)

    def _roles(self) -> tuple[str, ...]:
        return ("prefill", "decode") if self.pd else ("both",)

    def _members(self, slo_class: str, role: str) -> list[int]:
        return [k for p in self.pools if p.role == role
                and (not self.by_class or p.serves(slo_class)) for k in p.replicas]

    def _routable(self, ks: list[int]) -> list[int]:
        """The members a request may go to now: all of them (an autoscaled fleet keeps only
        its ready slots, sim/autoscale_pd.py)."""
        return ks

    def _group(self, slo_class: str, role: str) -> tuple[list[int], object]:
        key = (slo_class if self.by_class else "", role)
        if key not in self.groups:
            ks = self._routable(self._members(*key))
            if not ks:  # check_classes ran first for a whole workload; a stray class here
                raise FleetError(f"SLO class {slo_class!r}: no {role} pool serves it")
            policy = "least-requests" if self.by_class else self.router
            self.groups[key] = (ks, make_router(policy, [self.cores[k] for k in ks], self.seed))
        return self.groups[key]

    def _pick(self, prompt: Sequence[int], outstanding: Sequence[int], slo_class: str,
              role: str) -> int | None:
        ks, policy = self._group(slo_class, role)
        k = ks[policy.choose(prompt, [outstanding[i] for i in ks])]
        if self.admission is None:
            return k
        return self.admission.pick(k, ks, self.cores, outstanding, slo_class)

    # ---- sim.virtual.Dispatch ---------------------------------------------------
    def place(self, prompt: Sequence[int], outstanding: Sequence[int],
              session: Conversation) -> tuple[int, int | None] | None:
        if not self.pd:
            k = self._pick(prompt, outstanding, session.slo_class, "both")
            placed = None if k is None else (k, None)
        else:
            p = self._pick(prompt, outstanding, session.slo_class, "prefill")
            d = None if p is None else self._pick(prompt, outstanding, session.slo_class,
                                                  "decode")
            placed = None if d is None else (d, p)
        if placed is None:
            self.refused += 1
        return placed

    def transfer(self, prefill: int, decode: int, num_tokens: int,
                 t: float) -> tuple[float, float]:
        return self.links.transfer(prefill, decode, num_tokens, t)
