"""The committed wire code is what `make proto` generates from proto/ (byte for byte)."""

from __future__ import annotations

from pathlib import Path

from doppelchip import protogen


def test_generated_code_is_not_stale(tmp_path: Path):
    generated = protogen.generate(tmp_path)
    committed = sorted(
        p for p in (protogen.ROOT / "doppelchip" / "v1").iterdir() if "_pb2" in p.name
    )
    assert [p.name for p in generated] == [p.name for p in committed]
    stale = [p.name for p, c in zip(generated, committed, strict=True)
             if p.read_bytes() != c.read_bytes()]
    assert stale == [], f"run `make proto`: {stale} differ from proto/"


def test_every_proto_file_generates_code():
    names = {p.stem for p in protogen.proto_files()}
    assert names and all(
        (protogen.ROOT / "doppelchip" / "v1" / f"{n}_pb2.py").exists() for n in names
    )
