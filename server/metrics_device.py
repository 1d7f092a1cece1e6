"""doppelchip's own device metrics (`doppelchip_` prefix), labelled by deployment and chip.

Event-driven (each engine step, from `StepResult.cost`): bytes moved per memory tier, FLOPs,
busy seconds split by bound, SSD page-ins (llama.cpp weights re-read from SSD), compile events
and seconds by reason, pipeline idle seconds (the device waiting on a compile: Groq recompiles,
XLA/MLX new shapes), jump-forward tokens, the emulated step time, and an inter-token-latency
histogram with sub-millisecond buckets (vLLM's start at 10 ms, too coarse for SRAM chips).

All seconds are emulated seconds. Utilisation is per busy second, so it does not depend on the
server's `time_scale`: achieved bandwidth = rate(bytes) / rate(busy seconds), divided by the
tier's peak (`doppelchip_tier_peak_bandwidth_bytes_per_second`, all chips of the deployment).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from devices import Placement, catalog
from server.engine.events import FinishedEvent, StepEvent, TokensEvent

LABELS = ("deployment", "chip")

# 50 µs … 80 s: an SRAM chip's decode step (Groq, Cerebras) is well under vLLM's first 10 ms.
FINE_ITL_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
STEP_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 25.0, 60.0, 120.0, 300.0,
)


def compile_reason(stall_reason: str) -> str:
    """A short, bounded label for a compile stall's free-text reason."""
    if stall_reason.startswith("recompile"):
        return "recompile"
    if stall_reason.startswith("compiling new shape"):
        return "new_shape"
    return "other"


def tier_peaks(p: Placement) -> dict[str, float]:
    """Peak bytes/s of each memory tier the placement uses, over all chips holding it."""
    chip = p.chip
    parts = [(chip, p.chips)]
    spec = p.spec
    host_id = spec.host or chip.host
    host = catalog.get_chip(host_id) if host_id else None
    if host is not None:
        parts.append((host, 1))
    ssd_id = spec.ssd or chip.ssd or (host.ssd if host else None) or "nvme-gen4"  # as offload.py
    parts.append((catalog.get_chip(ssd_id), 1))
    used = {t for t, _ in p.weight_bytes}
    for stage in p.plan.stages:
        for seg in stage.segments:
            used.add(seg.kv_tier)
            used.update(t for t, _ in seg.weight_bytes)
    peaks: dict[str, float] = {}
    for part, count in parts:
        for tier in part.tiers:
            if tier.name in used and tier.name not in peaks:
                peaks[tier.name] = tier.bandwidth_bps * count
    return peaks


def peak_flops(p: Placement) -> float:
    """Dense peak FLOP/s of the deployment's chips on the engine's compute path."""
    path = p.engine.path_for(p.chip.chip_class)
    dtype = p.quant.compute_dtype if path == "quant" else path
    return p.chip.flops(dtype) * p.chips


class DeviceEvents:
    """The event-driven device metrics of one App (every deployment)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.bytes = Counter("doppelchip_tier_bytes", "Bytes moved per memory tier (all chips).",
                             [*LABELS, "tier"], registry=r)
        self.flops = Counter("doppelchip_flops", "FLOPs executed (all chips).", LABELS,
                             registry=r)
        self.busy = Counter("doppelchip_busy_seconds",
                            "Emulated seconds the device spent executing steps.", LABELS,
                            registry=r)
        self.bound = Counter("doppelchip_bound_seconds",
                             "Emulated busy seconds by what bounded the step "
                             "(memory, compute, overhead, link).", [*LABELS, "bound"],
                             registry=r)
        self.ssd = Counter("doppelchip_ssd_page_in_bytes",
                           "Weight bytes re-read from SSD (llama.cpp mmap page cache misses).",
                           LABELS, registry=r)
        self.compiles = Counter("doppelchip_compile_events",
                                "Compiles (stalls) and cold-start builds, by reason.",
                                [*LABELS, "reason"], registry=r)
        self.compile_s = Counter("doppelchip_compile_seconds",
                                 "Emulated seconds spent compiling or building, by reason.",
                                 [*LABELS, "reason"], registry=r)
        self.pipeline_idle = Counter("doppelchip_pipeline_idle_seconds",
                                     "Emulated seconds the pipeline idled waiting on a compile.",
                                     LABELS, registry=r)
        self.jump_forward = Counter("doppelchip_jump_forward_tokens",
                                    "Output tokens inserted by jump-forward decoding.", LABELS,
                                    registry=r)
        self.step = Histogram("doppelchip_step_seconds",
                              "Emulated duration of one engine step (compile stall included).",
                              LABELS, buckets=STEP_BUCKETS, registry=r)
        self.itl = Histogram("doppelchip_inter_token_latency_seconds",
                             "Inter-token latency (emulated), sub-millisecond buckets.", LABELS,
                             buckets=FINE_ITL_BUCKETS, registry=r)

    def observer(self, deployment: str, chip: str) -> DeviceObserver:
        return DeviceObserver(self, (deployment, chip))


class DeviceObserver:
    def __init__(self, ev: DeviceEvents, labels: tuple[str, str]) -> None:
        self.ev, self.labels = ev, labels
        self.busy = ev.busy.labels(*labels)
        self.flops = ev.flops.labels(*labels)
        self.ssd = ev.ssd.labels(*labels)
        self.pipeline_idle = ev.pipeline_idle.labels(*labels)
        self.step = ev.step.labels(*labels)
        self.itl = ev.itl.labels(*labels)
        self.jump_forward = ev.jump_forward.labels(*labels)

    def on_startup(self, seconds: float, cold: bool) -> None:
        if seconds > 0:
            self.ev.compiles.labels(*self.labels, "cold_start").inc()
            self.ev.compile_s.labels(*self.labels, "cold_start").inc(seconds)

    def on_step(self, event: StepEvent) -> None:
        r = event.result
        cost = r.cost
        busy = max(0.0, r.seconds - r.stall_s)
        self.busy.inc(busy)
        self.ev.bound.labels(*self.labels, cost.bound).inc(busy)
        n = r.micro_batches  # `cost` is one pipeline micro-batch's; the step ran n of them
        self.flops.inc(cost.flops * n)
        for tier, b in cost.bytes_by_tier:
            self.ev.bytes.labels(*self.labels, tier).inc(b * n)
            if tier == "ssd":
                self.ssd.inc(b * n)
        if r.stall_reason is not None:
            reason = compile_reason(r.stall_reason)
            self.ev.compiles.labels(*self.labels, reason).inc()
            self.ev.compile_s.labels(*self.labels, reason).inc(r.stall_s)
            self.pipeline_idle.inc(r.stall_s)
        self.step.observe(r.seconds)

    def on_tokens(self, event: TokensEvent) -> None:
        for interval in event.inter_token_latencies():
            self.itl.observe(interval)

    def on_request_finished(self, event: FinishedEvent) -> None:
        self.jump_forward.inc(event.finish.usage.jump_forward_tokens)
