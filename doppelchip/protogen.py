"""Regenerate the wire code: ``python -m doppelchip.protogen [OUT_DIR]`` (``make proto``).

The output is byte-stable because grpcio-tools is pinned exactly in pyproject.toml; a test
regenerates into a temporary folder and fails when the committed files differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / "doppelchip" / "v1").glob("*.proto"))


def generate(out_dir: Path = ROOT) -> list[Path]:
    """Run protoc on every proto file; return the generated files' paths."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    out = out_dir / "doppelchip" / "v1"
    return sorted(p for p in out.iterdir() if "_pb2" in p.name)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for path in generate(target):
        print(path)
