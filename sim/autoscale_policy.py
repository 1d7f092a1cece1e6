"""An autoscaler's policy (issue 16; docs/AUTOSCALING.md): the HPA's knobs and KEDA's for
scale to zero, parsed from `--autoscale` or a fleet file's `[deployments.autoscaling]` table.
The controller that applies it is `sim.autoscale.Autoscaler`."""

from __future__ import annotations

from dataclasses import dataclass, fields

METRICS = ("waiting", "kv", "running")


@dataclass(frozen=True)
class AutoscalePolicy:
    """One deployment's autoscaler; the defaults are the HPA's (and a target of 4 waiting
    requests per replica). `boot_s` overrides the cold start the device model gives;
    `provision_s` adds node/pod start-up before it (0: not modelled)."""

    metric: str = "waiting"
    target: float = 4.0
    min: int = 1
    max: int = 8
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_down_window_s: float = 300.0
    scale_up_window_s: float = 0.0
    boot_s: float | None = None
    provision_s: float = 0.0
    # --- scale to zero (KEDA ScaledObject: minReplicaCount 0, activation, cooldownPeriod) ---
    activation: float = 0.0  # the metric (or held requests) above which a pool at 0 wakes
    cooldown_s: float = 300.0  # inactive this long after the last active reading: 1 -> 0
    # KEDA HTTP add-on (keda.sh/http-add-on/1.0, "Configure Timeouts"): a request its
    # interceptor holds while no replica is ready fails 504 after this long (0: disabled, the
    # add-on's default, which bounds the wait only by a request timeout, also 0 by default)
    readiness_timeout_s: float = 0.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"autoscaling metric must be one of {', '.join(METRICS)}, "
                             f"got {self.metric!r}")
        if not self.target > 0:
            raise ValueError("autoscaling target must be > 0")
        if self.metric == "kv" and self.target > 1:
            raise ValueError(f"autoscaling on kv: the target is a fraction of the KV cache in "
                             f"(0, 1], got {self.target:g}")
        if not (0 <= self.min <= self.max and self.max >= 1):
            raise ValueError(f"autoscaling needs 0 <= min <= max and max >= 1, got "
                             f"min={self.min} max={self.max}")
        if min(self.activation, self.cooldown_s, self.readiness_timeout_s) < 0:
            raise ValueError("autoscaling: activation, cooldown_s and readiness_timeout_s "
                             "must be >= 0")
        if self.tolerance < 0 or not self.sync_period_s > 0:
            raise ValueError("autoscaling: tolerance must be >= 0 and sync_period_s > 0")
        if min(self.scale_down_window_s, self.scale_up_window_s, self.provision_s) < 0:
            raise ValueError("autoscaling: windows and provision_s must be >= 0")
        if self.boot_s is not None and self.boot_s < 0:
            raise ValueError("autoscaling: boot_s must be >= 0")


_ALIASES = {"min_replicas": "min", "max_replicas": "max", "sync_period": "sync_period_s",
            "scale_down_window": "scale_down_window_s", "scale_up_window": "scale_up_window_s",
            # KEDA's names (keda.sh/docs/latest/reference/scaledobject-spec/)
            "minReplicaCount": "min", "maxReplicaCount": "max", "pollingInterval":
            "sync_period_s", "cooldownPeriod": "cooldown_s", "cooldown": "cooldown_s",
            "activationThreshold": "activation",
            # the HTTP add-on's InterceptorRoute `timeouts.readiness`
            "readiness": "readiness_timeout_s", "readinessTimeout": "readiness_timeout_s"}


def parse_policy(spec: str | dict) -> AutoscalePolicy:
    """`metric=waiting,target=4,min=1,max=8` (the `--autoscale` flag) or the fleet file's
    `[deployments.autoscaling]` table → a policy (ValueError naming a bad key or value)."""
    if isinstance(spec, str):
        table: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"bad autoscaling term {part!r}: use KEY=VALUE")
            table[key.strip()] = value.strip()
        spec = table
    types = {f.name: f.type for f in fields(AutoscalePolicy)}
    out: dict[str, object] = {}
    for key, value in spec.items():
        name = _ALIASES.get(key, key)
        if name not in types:
            raise ValueError(f"unknown autoscaling key {key!r}; one of {', '.join(types)}")
        kind = types[name]
        try:
            if name == "metric":
                out[name] = str(value)
            elif "int" in str(kind):
                out[name] = int(value)  # type: ignore[arg-type]
            else:
                out[name] = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"autoscaling {key}: not a number: {value!r}") from None
    return AutoscalePolicy(**out)  # type: ignore[arg-type]
