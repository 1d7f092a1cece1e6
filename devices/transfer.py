"""Moving bytes between machines: ONE function for the time a transfer takes.

Why it exists: disaggregated prefill/decode moves a prompt's KV cache from the prefill
deployment's chips to the decode deployment's, and sleep mode brings weights back from host
memory or storage. Real time (the served P/D pods, `server/engine_proc/kv_connector.py`) and
virtual time (fleet simulation, the capacity-planning issue) must charge the same seconds,
so both call `transfer_seconds`. Pure: no clock, no I/O.

The model: ``latency + bytes / (bandwidth × lanes)``. ``lanes`` is how many ports move the
bytes in parallel — a tensor-parallel deployment's KV is split over its chips, each with its
own NIC (DGX: one per GPU), so a transfer between a tp-P and a tp-D deployment runs on
``min(P, D)`` ports at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices import catalog
from devices.errors import UnknownId
from devices.specs import ChipSpec

__all__ = ["Link", "get_link", "host_link", "kv_link", "list_links", "storage_link",
           "transfer_seconds"]


@dataclass(frozen=True)
class Link:
    """One port of a link: bytes/s in one direction, seconds of latency per transfer."""

    id: str
    name: str
    bandwidth_bps: float
    latency_s: float
    source: str = ""


def transfer_seconds(nbytes: float, link: Link, lanes: int = 1) -> float:
    """Seconds to move ``nbytes`` over ``lanes`` ports of ``link`` (0 bytes: 0 s)."""
    if nbytes <= 0:
        return 0.0
    if link.bandwidth_bps <= 0:
        raise ValueError(f"link {link.id!r} has no bandwidth")
    return link.latency_s + nbytes / (link.bandwidth_bps * max(1, lanes))


def get_link(ident: str) -> Link:
    """A link of ``devices/catalog/links.toml`` by id (UnknownId lists the known ones)."""
    table = catalog.link_table()
    if ident not in table:
        raise UnknownId("link", ident, sorted(table))
    raw = table[ident]
    return Link(ident, raw["name"], float(raw["bandwidth"]), float(raw["latency"]),
                raw.get("source", ""))


def list_links() -> list[Link]:
    return [get_link(i) for i in catalog.link_table()]


def kv_link(a: ChipSpec, b: ChipSpec, name: str | None = None) -> Link:
    """The link a KV transfer between chips ``a`` and ``b`` crosses: ``name`` when given,
    else the slower of the two chips' scale-out networks (the transfer runs at the pace of
    the narrower NIC)."""
    if name:
        return get_link(name)
    links = [get_link(c.scaleout) for c in (a, b) if c.scaleout]
    if not links:
        raise ValueError(f"neither {a.id} nor {b.id} names a scale-out network in the "
                         "catalogue; name the link in --kv-transfer-config")
    return min(links, key=lambda lk: lk.bandwidth_bps)


def host_link(chip: ChipSpec) -> Link | None:
    """The chip's link to host memory (PCIe, NVLink-C2C), None for unified memory (no copy:
    the weights never leave the one memory)."""
    if chip.host_link_bw_bps <= 0:
        return None
    return Link(f"{chip.id}:host", "host link", chip.host_link_bw_bps, 0.0,
                "chips.toml host_link_bw")


def storage_link(chip: ChipSpec) -> Link:
    """Where weights come back from after being discarded: the chip's SSD (catalogue
    ``ssd``; default ``nvme-gen4``, the ASSUMPTION devices/offload.py makes too: one NVMe
    drive per accelerator, as DGX H100's eight U.2 drives for eight GPUs), read no faster
    than the host link carries it to the chip."""
    ssd = catalog.get_chip(chip.ssd or "nvme-gen4")
    bw = ssd.tier.bandwidth_bps
    if chip.host_link_bw_bps > 0:
        bw = min(bw, chip.host_link_bw_bps)
    return Link(f"{chip.id}:storage", f"{ssd.name}", bw, 0.0, ssd.sources[0][1])
