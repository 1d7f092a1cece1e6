"""devices/ has no import cycle: every import, module-level or inside a function, points down.

The fitted factor table is bound once, at the top (``devices/__init__.py``); lower modules
(placement, estimate, cost, pipeline, calibration) take it as an argument, so none of them
needs to import a module that imports it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import devices

ROOT = Path(devices.__file__).parent


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def edges(paths: list[Path]) -> dict[str, set[str]]:
    """module -> devices modules it imports (anywhere in the file, function bodies too)."""
    names = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, node.module] if node.module else up)
                for a in node.names:  # `from devices import catalog` imports a submodule
                    found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in names else base)
        graph[me] = {m for m in found if m in names and m != me and m != "devices"}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules around it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*stack[stack.index(n):], n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_devices_has_no_import_cycle():
    paths = sorted(ROOT.rglob("*.py"))
    graph = edges(paths)
    assert len(graph) > 15 and "devices.placement" in graph
    assert find_cycle(graph) is None, find_cycle(graph)


def test_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    """The checker must catch the kind of cycle that used to exist (a lazy import inside a
    function), or the test above could not fail."""
    pkg = tmp_path / "devices"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "placement.py").write_text("def place():\n    from devices.calibration import x\n")
    (pkg / "calibration.py").write_text("from devices.placement import place\nx = 1\n")
    global ROOT
    saved, ROOT = ROOT, pkg
    try:
        graph = edges(sorted(pkg.rglob("*.py")))
    finally:
        ROOT = saved
    assert find_cycle(graph) in (
        ["devices.calibration", "devices.placement", "devices.calibration"],
        ["devices.placement", "devices.calibration", "devices.placement"],
    )


def test_lower_modules_do_not_bind_the_fitted_table():
    """Only the package top binds calibration.fitted_factors; placement and estimate take the
    table as an argument."""
    for name in ("placement.py", "estimate.py", "cost.py", "pipeline.py", "place_hbm.py",
                 "place_sram.py", "offload.py", "placed.py"):
        assert "fitted_factors" not in (ROOT / name).read_text(), name
