"""Imports point down the layers in DESIGN.md; the front door imports each layer lazily."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICE_MODULES = {"server.app", "server.config", "server.convert", "server.fleet",
                   "server.metrics", "server.metrics_device", "server.metrics_vllm",
                   "server.servicer", "server.vllm_convert", "server.vllm_servicer"}


def imports(path: Path, package: str, top_level_only: bool = False) -> set[str]:
    """Absolute module names a file of `package` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "_pb2" not in p.name)


def violations(folder: str, forbidden: tuple[str, ...], top_level_only: bool = False) -> list:
    return check(files(folder), forbidden, top_level_only)


def check(paths: list[Path], forbidden: tuple[str, ...], top_level_only: bool = False) -> list:
    bad = []
    for path in paths:
        package = ".".join(path.relative_to(ROOT).parts[:-1]) if path.is_relative_to(ROOT) else ""
        for module in imports(path, package, top_level_only):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                bad.append((str(path), module))
    return bad


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("devices", ("asyncio", "grpc", "server", "clients", "doppelchip", "smg_grpc_proto")),
        ("server/engine", ("grpc", "clients", "doppelchip", "prometheus_client", "smg_grpc_proto",
                            *sorted(SERVICE_MODULES))),
        ("server", ("clients",)),
        ("clients", ("server",)),
    ],
)
def test_imports_point_down(folder, forbidden):
    assert violations(folder, forbidden) == []


def test_front_door_imports_layers_lazily():
    front = [ROOT / "doppelchip" / "cli.py", *sorted((ROOT / "doppelchip").glob("cmd_*.py"))]
    assert check(front, ("server", "clients", "devices"), top_level_only=True) == []
    # the wire code and the proto generator belong to no layer above them
    wire = [p for p in files("doppelchip") if p.parent.name == "v1" or p.name == "protogen.py"]
    assert check(wire, ("server", "clients", "devices")) == []
    loaded = subprocess.run(
        [sys.executable, "-c",
         "import sys, doppelchip.cli; print(sorted({m.split('.')[0] for m in sys.modules}))"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout
    for layer in ("server", "clients", "devices"):
        assert f"'{layer}'" not in loaded


def test_checker_sees_a_violation(tmp_path):
    """The checker itself must catch an upward import (so the tests above can fail)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import asyncio\nfrom server.engine import interface\n")
    found = {m for _, m in check([probe], ("asyncio", "server"))}
    assert {"asyncio", "server.engine"} <= found
