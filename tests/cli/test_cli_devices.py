"""`doppelchip devices`: the tables name each entry's public source (the catalogue's), and
`--json` is one line (the last line of a --json command is its object)."""

from __future__ import annotations

import json

import pytest

from devices import catalog
from doppelchip.cli import main


def rows_of(out: str, header: str) -> tuple[str, dict[str, str]]:
    """The header line and {first cell: whole line} of the table whose header starts with
    `header`."""
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(header + " "))
    rows = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows[line.split()[0]] = line
    return lines[start], rows


def test_devices_tables_have_a_source_column(capsys: pytest.CaptureFixture[str]):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    for header, entries in (("chip", [(c.id, dict(c.sources)["catalogue"])
                                      for c in catalog.list_chips(None)]),
                            ("model", [(m.id, m.source) for m in catalog.list_models()]),
                            ("quant", [(q.id, q.source) for q in catalog.list_quants()]),
                            ("checkpoint", [(c.repo, c.source)
                                            for c in catalog.list_checkpoints()])):
        head, rows = rows_of(out, header)
        assert head.rstrip().endswith("source"), head
        assert set(rows) == {i for i, _ in entries}
        for ident, source in entries:
            assert source and rows[ident].rstrip().endswith(source), (ident, rows[ident])


def test_no_sources_leaves_the_column_out(capsys: pytest.CaptureFixture[str]):
    assert main(["devices", "--no-sources"]) == 0
    out = capsys.readouterr().out
    head, rows = rows_of(out, "chip")
    assert "source" not in head and "glennklockwood" not in out
    assert "h100-sxm" in rows


def test_devices_json_is_one_line_with_the_sources(capsys: pytest.CaptureFixture[str]):
    assert main(["devices", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    data = json.loads(out.splitlines()[-1])
    assert all(c["source"] for c in data["chips"])


def test_devices_shows_the_vendors_figure_and_what_the_device_reports(
        capsys: pytest.CaptureFixture[str]):
    """Device memory shows the vendor's "80 GB" and the 81,559 MiB an H100 reports (which
    placement uses); memory without a reported total (SRAM, unified) shows one figure."""
    assert main(["devices", "--no-sources"]) == 0
    _, rows = rows_of(capsys.readouterr().out, "chip")
    assert "hbm 80 GB (81,559 MiB) @" in rows["h100-sxm"]
    assert "unified 128 GB @" in rows["m4-max-40"] and "MiB" not in rows["m4-max-40"]
    assert main(["devices", "--json"]) == 0
    chips = {c["id"]: c for c in json.loads(capsys.readouterr().out)["chips"]}
    assert chips["h100-sxm"]["tiers"][0]["nominal_bytes"] == 80e9
    assert chips["h100-sxm"]["tiers"][0]["capacity_bytes"] == 81559 * 2**20


def test_devices_shows_how_each_engine_sizes_its_kv_cache(capsys: pytest.CaptureFixture[str]):
    assert main(["devices", "--json"]) == 0
    engines = {e["id"]: e for e in json.loads(capsys.readouterr().out)["engines"]}
    assert engines["sglang"]["memory"]["rule"] == "static"
    assert engines["sglang"]["memory"]["fraction"] is None  # computed from its reserve
    assert engines["tensorrt-llm"]["memory"]["rule"] == "free"
    assert engines["mlx"]["memory"] is None
    tiers = engines["vllm"]["scheduler"]["by_memory"]
    assert [t["max_num_batched_tokens"] for t in tiers] == [8192, 16384]
    assert [(t["max_num_seqs"], t["except_names"]) for t in tiers] == [(1024, ["a100"]),
                                                                        (1024, [])]
    assert main(["devices"]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("sglang "))
    assert row.rstrip().endswith("static auto")
