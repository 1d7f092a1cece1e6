"""The device catalogue: chips, host parts, engines, models and quantisations by id.

The data lives beside this module in TOML files (``chips.toml``, ``engines.toml``,
``models.toml``, ``quants.toml``); every number carries its public source there. Lookups raise
:class:`devices.errors.UnknownId` listing the known ids.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

from devices import disk_cache
from devices.errors import UnknownId
from devices.specs import (
    MIB,
    BatchTier,
    CheckpointSpec,
    ChipSpec,
    EngineSpec,
    KvSeqs,
    MemoryRule,
    ModelSpec,
    QuantSpec,
    SchedulerDefaults,
    Tier,
)

_DIR = Path(__file__).parent


def toml(name: str) -> dict[str, Any]:
    """``name.toml`` of this folder, parsed (one shared dict: do not modify it)."""
    return _tables()[name]


@cache
def _tables() -> dict[str, dict[str, Any]]:
    """Every TOML file of this folder, parsed: from the on-disk memo of ``devices.disk_cache``
    when no input changed (JSON reads ~30x faster than ``tomllib`` parses), else parsed and
    stored there. The memo is keyed by the digest of every file of ``devices``, these
    included, so it is never stale."""
    directory = disk_cache.cache_dir()
    digest = None
    if directory is not None:
        try:
            digest = disk_cache.inputs_digest()
        except OSError:  # an unreadable input: no key to trust
            directory = None
    if directory is not None and digest is not None:
        stored = disk_cache.read("catalog", digest, directory)
        if isinstance(stored, dict):
            return stored
    tables = parse_tables()
    if directory is not None and digest is not None:
        disk_cache.write("catalog", digest, tables, directory)
    return tables


def parse_tables(folder: Path = _DIR) -> dict[str, dict[str, Any]]:
    """Every ``*.toml`` of ``folder`` by stem, parsed with ``tomllib``."""
    import tomllib  # only when parsing: a start-up that reads the memo skips it

    out = {}
    for path in sorted(folder.glob("*.toml")):
        with path.open("rb") as f:
            out[path.stem] = tomllib.load(f)
    return out


def pricing() -> dict[str, float]:
    """The price rule's constants (amortisation hours, $/kWh)."""
    return dict(toml("chips")["pricing"])


def _usd_per_hour(raw: dict[str, Any]) -> tuple[float, str]:
    """Apply the catalogue's one price rule (see chips.toml header)."""
    rule = pricing()
    if "cloud_usd_per_hour" in raw:
        vals = raw["cloud_usd_per_hour"]
        return math.prod(vals) ** (1 / len(vals)), "cloud on-demand (geometric mean of range)"
    purchase = raw.get("purchase_usd", 0.0)
    if isinstance(purchase, list):
        purchase = math.prod(purchase) ** (1 / len(purchase))
    amortised = purchase / rule["amortisation_hours"]
    power = raw["busy_watts"] / 1000 * rule["usd_per_kwh"]
    return amortised + power, "bought: price / 3 years + busy power at $0.10/kWh"


def _tier(raw: dict[str, Any]) -> Tier:
    """A memory tier: ``capacity`` is the vendor's figure; ``reported_mib``, where given, the
    total the device reports to software, which placement uses (``Tier``)."""
    nominal = float(raw["capacity"])
    reported = raw.get("reported_mib")
    if reported is None:
        return Tier(raw["name"], nominal, float(raw["bandwidth"]))
    return Tier(raw["name"], float(reported) * MIB, float(raw["bandwidth"]), nominal)


def _chip(ident: str, raw: dict[str, Any]) -> ChipSpec:
    usd, basis = _usd_per_hour(raw)
    tiers = tuple(_tier(t) for t in raw["tiers"])
    return ChipSpec(
        id=ident,
        name=raw["name"],
        kind=raw["kind"],
        vendor=raw["vendor"],
        chip_class=raw["class"],
        arch=raw["arch"],
        placement=raw["placement"],
        tiers=tiers,
        peak_flops=tuple((k, float(v)) for k, v in raw["peak"].items()),
        link_bw_bps=float(raw["link_bw"]),
        hop_latency_s=float(raw["hop_latency"]),
        lane_bw_bps=float(raw.get("lane_bw", 0.0)),
        collective_base_s=float(raw.get("collective_base", 0.0)),
        domain_size=int(raw.get("domain_size", 1)),
        scaleout_bw_bps=float(raw.get("scaleout_bw", 0.0)),
        scaleout_latency_s=float(raw.get("scaleout_latency", 0.0)),
        launch_s=float(raw.get("launch", 0.0)),
        host_link_bw_bps=float(raw["host_link_bw"]),
        matmul_tile=int(raw.get("matmul_tile", 1)),
        usable_fraction=float(raw.get("usable_fraction", 1.0)),
        busy_watts=float(raw["busy_watts"]),
        idle_watts=float(raw["idle_watts"]),
        usd_per_hour=usd,
        price_basis=basis,
        host=raw.get("host"),
        ssd=raw.get("ssd"),
        os_reserve_bytes=float(raw.get("os_reserve_bytes", 0.0)),
        scaleout=raw.get("scaleout"),  # P/D (issue 13): links.toml id
        sources=(("catalogue", raw.get("source", "")),),
    )


@cache
def _chips() -> dict[str, ChipSpec]:
    data = toml("chips")
    out: dict[str, ChipSpec] = {}
    for section in ("chips", "hosts", "storage"):
        for ident, raw in data.get(section, {}).items():
            out[ident] = _chip(ident, raw)
    return out


def _ascending(tiers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tiers by GPU memory (``min_memory`` in bytes), smallest first: the last one a chip
    reaches applies."""
    return sorted(tiers, key=lambda t: float(t["min_memory"]))


def _scheduler(raw: dict[str, Any]) -> SchedulerDefaults:
    tiers = _ascending(raw.get("by_memory", []))
    return SchedulerDefaults(
        policy=raw["policy"], max_num_seqs=raw.get("max_num_seqs"),
        max_num_batched_tokens=raw.get("max_num_batched_tokens"),
        by_memory=tuple(BatchTier(float(t["min_memory"]), t.get("max_num_seqs"),
                                  t.get("max_num_batched_tokens"),
                                  tuple(t.get("except_names", ()))) for t in tiers),
        kv_seqs=KvSeqs(**raw["kv_seqs"]) if "kv_seqs" in raw else None,
    )


def _memory(raw: dict[str, Any] | None) -> MemoryRule | None:
    """An engine's ``memory``: without ``fraction`` its share is computed (SGLang's reserve).
    None: an engine that never sizes a pool on sharded device memory (offload, unified, SRAM)."""
    if raw is None:
        return None
    if raw.get("rule") not in ("total", "free", "static"):
        raise ValueError(f"memory rule {raw.get('rule')!r}: expected total, free or static")
    tiers = _ascending(raw.get("graph_seqs", []))
    return MemoryRule(**{"fraction": None, **raw, "graph_seqs": tuple(
        (float(t["min_memory"]), int(t["seqs"])) for t in tiers)})


@cache
def _engines() -> dict[str, EngineSpec]:
    out = {}
    for ident, raw in toml("engines")["engines"].items():
        out[ident] = EngineSpec(
            id=ident,
            name=raw["name"],
            chip_classes=tuple(raw["chip_classes"]),
            kv_layout=raw["kv_layout"],
            batching=raw["batching"],
            prefix_cache=raw["prefix_cache"],
            kernels_per_layer=float(raw["kernels_per_layer"]),
            compile=raw["compile"],
            compute_path=tuple(raw["compute_path"].items()),
            scheduler=_scheduler(raw["scheduler"]),
            kernel_paths=tuple((k, tuple(v.items()))
                               for k, v in raw.get("kernel_paths", {}).items()),
            launch=raw["launch"],
            shape_buckets=raw.get("shape_buckets", "exact"),
            speculative_methods=tuple(raw.get("speculative_methods", ())),
            expert_parallel=bool(raw.get("expert_parallel", False)),
            dp_shares_experts=bool(raw.get("dp_shares_experts", False)),
            tp_divides_heads=bool(raw.get("tp_divides_heads", False)),
            uva_offload=bool(raw.get("uva_offload", False)),
            memory=_memory(raw.get("memory")),
            kv_block_size=int(raw.get("kv_block_size", 16)),
            kv_block_size_by_vendor=tuple(raw.get("kv_block_size_by_vendor", {}).items()),
            jump_forward=bool(raw["jump_forward"]),
            deterministic=bool(raw["deterministic"]),
            offload=bool(raw["offload"]),
            compile_seconds=float(raw["compile_seconds"]),
            borrow_from=tuple(raw["borrow_from"]),
            flop_eff_scale=float(raw.get("flop_eff_scale", 1.0)),
            quant_families=tuple(raw["quant_families"]),
        )
    return out


@cache
def _models() -> dict[str, ModelSpec]:
    out = {}
    for ident, raw in toml("models")["models"].items():
        out[ident] = ModelSpec(id=ident, **raw)
    return out


@cache
def _quants() -> dict[str, QuantSpec]:
    return {ident: QuantSpec(id=ident, **{**raw, "vllm_quantization": tuple(
        raw.get("vllm_quantization", ()))}) for ident, raw in toml("quants")["quants"].items()}


@cache
def _checkpoints() -> dict[str, CheckpointSpec]:
    """By lower-cased repository id (the Hub resolves ids case-insensitively)."""
    return {repo.lower(): CheckpointSpec(repo=repo, **raw)
            for repo, raw in toml("checkpoints")["checkpoints"].items()}


def _get(kind: str, table: dict[str, Any], ident: str) -> Any:
    try:
        return table[ident]
    except KeyError:
        raise UnknownId(kind, ident, sorted(table)) from None


def get_chip(ident: str) -> ChipSpec:
    """A chip, host part or storage part by id (e.g. ``h100-sxm``, ``ddr5-dual-channel``)."""
    return _get("chip", _chips(), ident)


def get_engine(ident: str) -> EngineSpec:
    return _get("engine", _engines(), ident)


def get_model(ident: str) -> ModelSpec:
    return _get("model", _models(), ident)


def get_quant(ident: str) -> QuantSpec:
    return _get("quantisation", _quants(), ident)


def get_checkpoint(repo: str) -> CheckpointSpec:
    """A Hugging Face checkpoint by repository id (``meta-llama/Llama-3.1-8B-Instruct``)."""
    found = _checkpoints().get(repo.lower())
    if found is None:
        raise UnknownId("checkpoint", repo, sorted(c.repo for c in _checkpoints().values()))
    return found


def list_checkpoints() -> list[CheckpointSpec]:
    return list(_checkpoints().values())


def quant_for_vllm(method: str) -> QuantSpec:
    """The weight format vLLM's ``--quantization METHOD`` loads."""
    for quant in _quants().values():
        if method in quant.vllm_quantization:
            return quant
    known = sorted(m for q in _quants().values() for m in q.vllm_quantization)
    raise UnknownId("vLLM quantization method", method, known)


def list_chips(kind: str | None = "accelerator") -> list[ChipSpec]:
    """Chips of one kind ('accelerator', 'host', 'storage'), or all with ``kind=None``."""
    return [c for c in _chips().values() if kind is None or c.kind == kind]


def list_engines() -> list[EngineSpec]:
    return list(_engines().values())


def list_models() -> list[ModelSpec]:
    return list(_models().values())


def list_quants() -> list[QuantSpec]:
    return list(_quants().values())


def nearest_classes(chip_class: str) -> tuple[str, ...]:
    """The classes whose factors stand in for ``chip_class``'s missing ones, nearest first."""
    return tuple(toml("chips").get("classes", {}).get(chip_class, ()))


def chip_classes() -> list[str]:
    """Every chip class (the keys, with engine ids, of the efficiency factors)."""
    return sorted({c.chip_class for c in _chips().values()})


# --- P/D (issue 13): links between machines (links.toml) ---
def link_table() -> dict[str, dict[str, Any]]:
    """Every link of ``links.toml`` by id (raw records; ``devices.transfer`` builds Links)."""
    return dict(toml("links")["links"])
