"""devices: the physics of every emulated chip and engine (pure Python + numpy).

Nothing here imports asyncio, grpc, ``server`` or ``clients``; every function is pure except
the small stateful compile strategies and the seeded jitter generator.

The interface the engine calls::

    from devices import (DeploymentSpec, BatchShape, place, step_cost, estimate,
                         make_compile_strategy, make_jitter, catalog)

    spec = DeploymentSpec(model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm")
    placement = place(spec)              # raises devices.errors.PlacementError with the reason
    placement.kv_blocks()                # KV capacity in blocks (the engine's block size)
    placement.max_context, placement.chips, placement.weight_bytes, placement.max_concurrency()
    compile = make_compile_strategy(placement)
    compile.startup_seconds(cold=False)  # build / load time before serving
    stall = compile.before_step(batch)   # Stall(seconds, reason) — compile stalls
    cost = step_cost(placement, compile.padded(batch))  # StepCost: seconds, interval_s, bytes
    jitter = make_jitter(placement, sigma=0.0, seed=0)  # by tier, flops, bound, joules, dollars
    seconds = jitter.apply(cost.seconds)

* ``catalog``: ``get_chip/get_engine/get_model/get_quant(id)`` and ``list_*()``; unknown ids
  raise :class:`devices.errors.UnknownId` (a :class:`devices.errors.DeviceError`).
* ``DeploymentSpec`` (frozen): model, quant, chip, engine, count, tp, pp, ep, n_gpu_layers,
  built_for, gpu_mem_utilisation, max_context, max_batch, max_batched_tokens, build limits,
  host/ssd overrides, kv_cache_dtype, speculative (a ``SpeculativeConfig``).
* ``place(spec, factor_table=None, ranks=1) -> Placement`` (the fitted table is bound here, at
  the top; lower modules take it as an argument): weights per tier, chips used, KV capacity
  (tokens and ``kv_blocks(block_size)``), max context, ``max_concurrency(context_tokens)``,
  ``memory_bytes(kv_tokens_used)``, ``load_seconds``; precomputed cost constants in ``plan``.
  ``ranks`` > 1: one of that many data-parallel engine cores (a MoE model's ranks on an engine
  whose ranks share the experts are one group: ``placement.place_rank``).
* ``BatchShape(prefill=((num_tokens, start_position), ...), decode=(context_length, ...))``.
* ``step_cost(placement, batch) -> StepCost`` (see its docstring; cheap, call every step).
* ``estimate(spec, prompt, output, batch=1, factor_table=None, ranks=1) -> dict``: the
  ``doppelchip estimate`` point (of one rank when ``ranks`` > 1).
* ``calibration.fitted_factors()``: efficiency factors per (engine, chip class), fitted from
  the calibration points of ``reference/hardware.md`` (see ``devices/calibration.py``).
"""

from typing import Any

from devices import catalog
from devices import estimate as _estimate
from devices import placement as _placement
from devices.calibration import fitted_factors
from devices.compile import CompileStrategy, Stall, make_compile_strategy
from devices.cost import StepCost, step_cost
from devices.deployment import BatchShape, DeploymentSpec
from devices.errors import DeviceError, PlacementError, ShapeError, UnknownId
from devices.factors import Factors, Provenance
from devices.jitter import Jitter, make_jitter
from devices.placed import FactorTable, Placement
from devices.speculative import SpeculativeConfig, SpeculativeConfigError


def place(spec: DeploymentSpec, factor_table: FactorTable | None = None,
          ranks: int = 1) -> Placement:
    """Place ``spec`` with the fitted efficiency factors (or ``factor_table``); ``ranks`` > 1:
    one of that many data-parallel engine cores (``devices.placement.place_rank``). The one
    place the fitted table is bound: lower modules take it as an argument."""
    table = fitted_factors() if factor_table is None else factor_table
    return _placement.place(spec, table, ranks)


def estimate(spec: DeploymentSpec, prompt: int, output: int, batch: int = 1,
             factor_table: FactorTable | None = None, ranks: int = 1) -> dict[str, Any]:
    """``devices.estimate.estimate`` with the fitted factors (or ``factor_table``); ``ranks``
    > 1: one data-parallel rank's point."""
    table = fitted_factors() if factor_table is None else factor_table
    return _estimate.estimate(spec, prompt, output, batch, table, ranks)


__all__ = [
    "BatchShape",
    "CompileStrategy",
    "DeploymentSpec",
    "DeviceError",
    "FactorTable",
    "Factors",
    "Jitter",
    "Placement",
    "PlacementError",
    "Provenance",
    "ShapeError",
    "SpeculativeConfig",
    "SpeculativeConfigError",
    "Stall",
    "StepCost",
    "UnknownId",
    "catalog",
    "estimate",
    "fitted_factors",
    "make_compile_strategy",
    "make_jitter",
    "place",
    "step_cost",
]
