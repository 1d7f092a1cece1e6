"""devices.transfer: the one transfer-time function, and the catalogue's links behind it."""

from __future__ import annotations

import pytest

from devices import catalog
from devices.transfer import (
    get_link,
    host_link,
    kv_link,
    list_links,
    storage_link,
    transfer_seconds,
)


def test_transfer_is_latency_plus_bytes_over_bandwidth():
    link = get_link("ib-ndr-400")
    assert link.bandwidth_bps == 400e9 / 8  # NDR: 400 Gb/s per port
    assert transfer_seconds(2e9, link) == pytest.approx(link.latency_s + 2e9 / 50e9)
    # two ports in parallel (a tp=2 deployment's KV split over its NICs): half the bytes time
    assert transfer_seconds(2e9, link, lanes=2) == pytest.approx(link.latency_s + 1e9 / 50e9)
    assert transfer_seconds(0, link) == 0.0


def test_every_accelerator_names_a_catalogued_network_consistent_with_its_collectives():
    for chip in catalog.list_chips("accelerator"):
        assert chip.scaleout, f"{chip.id} has no scale-out network"
        link = get_link(chip.scaleout)
        assert link.source and link.bandwidth_bps > 0
        if chip.scaleout_bw_bps:  # the collectives' figure and the link's must agree
            assert chip.scaleout_bw_bps == link.bandwidth_bps, chip.id


def test_kv_link_defaults_to_the_slower_network_and_honours_a_named_link():
    h100, a100 = catalog.get_chip("h100-sxm"), catalog.get_chip("a100-sxm-80g")
    assert kv_link(h100, a100).id == "ib-hdr-200"  # the narrower NIC sets the pace
    assert kv_link(h100, h100, "nvlink4").bandwidth_bps == 450e9
    with pytest.raises(Exception, match="link"):
        kv_link(h100, h100, "no-such-link")


def test_weights_come_back_over_the_host_link_or_from_storage():
    h100 = catalog.get_chip("h100-sxm")
    assert host_link(h100).bandwidth_bps == h100.host_link_bw_bps  # PCIe 5.0 x16
    assert storage_link(h100).bandwidth_bps == 7e9  # an NVMe Gen4 drive, slower than PCIe
    assert host_link(catalog.get_chip("m2-ultra-60")) is None  # unified memory: no copy
    assert {lk.id for lk in list_links()} >= {"nvlink4", "ib-ndr-400", "eth-100g"}
