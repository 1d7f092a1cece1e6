"""Placement: where every layer's weights live, how much KV fits, how many chips are needed.

``place(spec, factor_table)`` is pure: the same spec and table give the same
:class:`~devices.placed.Placement`, and a deployment that cannot be placed raises
:class:`devices.errors.PlacementError` saying why. The strategy follows the chip's
``placement`` trait and the engine's ``offload`` trait (catalogue data, never ids):

* a host CPU, or an engine that offloads on a chip with a host box → ``devices.offload``
  (llama.cpp: VRAM, host RAM, SSD under mmap);
* 'sram' → ``devices.place_sram`` (Groq, Cerebras: pipelined over computed chips);
* 'sharded' / 'unified' → ``devices.place_hbm`` (GPUs, TPUs, Apple).

The factor table is an argument, never looked up here: ``devices.__init__`` binds the fitted
table once, at the top, and calibration passes its own tables while it fits.
"""

from __future__ import annotations

import dataclasses

from devices import catalog
from devices.deployment import DeploymentSpec
from devices.errors import PlacementError
from devices.offload import place_offload
from devices.parallel import resolve_parallelism
from devices.place_hbm import place_hbm, step_budget
from devices.place_sram import place_sram
from devices.placed import FactorTable, Placement
from devices.specs import ChipSpec, EngineSpec, ModelSpec, QuantSpec


def served_model(spec: DeploymentSpec) -> ModelSpec:
    """The catalogue model as the deployment serves it: converted to a pooling model when
    ``spec.convert`` says so (``ModelSpec.as_pooling``)."""
    model = catalog.get_model(spec.model)
    return model.as_pooling(spec.convert, spec.num_labels) if spec.convert else model


def resolve(spec: DeploymentSpec) -> tuple[ModelSpec, QuantSpec, ChipSpec, EngineSpec]:
    """Look the ids up and check the engine accepts this chip and weight format."""
    model, quant = served_model(spec), catalog.get_quant(spec.quant)
    chip, engine = catalog.get_chip(spec.chip), catalog.get_engine(spec.engine)
    if chip.kind == "storage":
        raise PlacementError(f"{chip.id} is storage, not a processor")
    if chip.chip_class not in engine.chip_classes:
        raise PlacementError(
            f"{engine.name} runs on {', '.join(engine.chip_classes)} chips, "
            f"not on {chip.id} ({chip.chip_class})"
        )
    if quant.family not in engine.quant_families:
        raise PlacementError(
            f"{engine.name} does not load {quant.id} weights "
            f"(it loads: {', '.join(engine.quant_families)} formats)"
        )
    if engine.compile == "ahead_of_time" and spec.built_for and spec.built_for != chip.arch:
        raise PlacementError(
            f"{engine.name} engine built for {spec.built_for} cannot run on {chip.id} "
            f"({chip.arch}): the engine plan file is generated on an incompatible device; "
            f"rebuild the engine for {chip.arch}"
        )
    if spec.max_context and spec.max_context > model.max_context:
        # vLLM's ModelConfig (_get_and_verify_max_len): positions past the trained context
        # are NaN under RoPE, out of bounds with absolute positions
        raise PlacementError(
            f"User-specified max_model_len ({spec.max_context}) is greater than the derived "
            f"max_model_len (max_position_embeddings={model.max_context} in {model.name}'s "
            "config.json)")
    if spec.enforce_eager and engine.launch == "graph":  # no graphs captured: host launches
        engine = dataclasses.replace(engine, launch="eager")
    sp = spec.speculative
    if sp is not None and sp.method not in engine.speculative_methods:
        raise PlacementError(
            f"{engine.name} does not run speculative method {sp.method!r} "
            f"(it runs: {', '.join(engine.speculative_methods) or 'none'})")
    return model, quant, chip, engine


def place(spec: DeploymentSpec, factor_table: FactorTable, ranks: int = 1) -> Placement:
    """Place a deployment with the efficiency factors of ``factor_table``; with ``ranks`` > 1,
    one of that many data-parallel engine cores each running ``spec`` (``place_rank``)."""
    if ranks != 1:
        return place_rank(spec, ranks, factor_table)
    model, quant, chip, engine = resolve(spec)
    if chip.placement == "host" or (engine.offload and chip.host):
        return place_offload(spec, model, quant, chip, engine, factor_table)
    if chip.placement == "sram":
        return place_sram(spec, model, quant, chip, engine, factor_table)
    return place_hbm(spec, model, quant, chip, engine, factor_table)


def place_rank(spec: DeploymentSpec, ranks: int, factor_table: FactorTable) -> Placement:
    """One engine core of ``ranks`` data-parallel ranks, each running ``spec`` (vLLM's
    ``--data-parallel-size``: that many engine cores behind one front end).

    Ranks of a dense model, or of an engine whose ranks are replicas, are independent copies:
    ``spec`` itself. An engine whose ranks share a MoE model's experts (``dp_shares_experts``)
    places the group — every rank's chips, the experts sharded over all of them, each rank an
    attention replica with its own sequences and step budget — and gives one rank's view of
    it (``Placement.rank_view``). ASSUMPTION (balanced DP, as vLLM's coordinator routes to the
    least-loaded rank): each step costs as if every rank carried a batch like this rank's."""
    if ranks < 1:
        raise PlacementError(f"data_parallel_size {ranks} must be at least 1")
    model, _, chip, engine = resolve(spec)
    if ranks == 1 or not (model.is_moe and engine.dp_shares_experts):
        return place(spec, factor_table)
    par = resolve_parallelism(spec, chip, model, engine)
    budget = step_budget(spec, engine, chip)
    group = dataclasses.replace(
        spec, count=par.chips * ranks, tp=par.tp, pp=par.pp, ep=par.tp * par.dp * ranks,
        max_batched_tokens=budget * ranks if budget else None)
    return place(group, factor_table).rank_view(ranks, spec)
