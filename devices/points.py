"""The calibration points: the only published measurements any factor is fitted to.

They come from ``../shared/reference/hardware.md`` ("Calibration points"), copied with their
sources into ``devices/catalog/calibration.toml``. A point names a deployment and a
llama-bench-like setting; its group is (engine, chip class), never the chip or the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices import catalog
from devices.deployment import DeploymentSpec

Group = tuple[str, str]


@dataclass(frozen=True)
class Point:
    """One published measurement (hardware.md, "Calibration points")."""

    id: str
    engine: str
    chip: str
    model: str
    quant: str
    kind: str  # 'decode' | 'prefill' | 'throughput'
    value: float  # tokens per second (per user for decode/prefill; aggregate for throughput)
    source: str
    prompt: int = 512
    output: int = 128
    batch: int = 1
    count: int | None = None
    fit: bool = True  # False: checked, not used to set a factor
    tolerance: float = 0.20

    @property
    def spec(self) -> DeploymentSpec:
        return DeploymentSpec(
            model=self.model, quant=self.quant, chip=self.chip, engine=self.engine,
            count=self.count,
        )

    @property
    def group(self) -> Group:
        return (self.engine, catalog.get_chip(self.chip).chip_class)


def load_points() -> tuple[Point, ...]:
    """The calibration table, ``devices/catalog/calibration.toml``."""
    return tuple(Point(**raw) for raw in catalog.toml("calibration")["points"])


POINTS: tuple[Point, ...] = load_points()
