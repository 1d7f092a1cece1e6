"""Imports point down the layers in DESIGN.md, never in a circle; the front door imports each
layer lazily and no layer imports the front door."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("server", "devices", "clients", "sim", "doppelchip")
# The front door: the command and the logic beside it (everything in doppelchip/ but the
# generated wire code in doppelchip/v1/, the bottom layer every layer may import).
FRONT_DOOR = tuple(sorted(
    f"doppelchip.{p.stem}" for p in (ROOT / "doppelchip").glob("*.py") if p.stem != "__init__"))


# the clients' modules that talk to a server (sim/ may use the rest: workloads, reports)
SERVING_CLIENTS = ("clients.client", "clients.loadgen", "clients.server_metrics",
                   "clients.generate")


def _nodes(tree: ast.Module, top_level_only: bool) -> list[ast.AST]:
    """Every node (or the top level only), skipping `if TYPE_CHECKING:` blocks: imports for
    type checkers are not run."""
    if top_level_only:
        return list(tree.body)
    found: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if (isinstance(child, ast.If) and isinstance(child.test, ast.Name)
                    and child.test.id == "TYPE_CHECKING"):
                continue
            found.append(child)
            todo.append(child)
    return found


def imports(path: Path, package: str, top_level_only: bool = False) -> set[str]:
    """Absolute module names a file of `package` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in _nodes(tree, top_level_only):
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


def _sim_service_modules() -> list[str]:
    """What sim/ may not import of the service layer: all of it but the fleet file's parser
    (server.config), which is plain data over the engine layer (test below)."""
    return [m for m in service_modules() if m != "server.config"]


def service_modules() -> list[str]:
    """Every module of server/ outside its engine layer."""
    return sorted(module_name(p) for p in files("server")
                  if not p.is_relative_to(ROOT / "server" / "engine")
                  and p != ROOT / "server" / "__init__.py")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
        ("devices", ("asyncio", "grpc", "server", "clients", "sim", "doppelchip",
                     "smg_grpc_proto")),
        ("server/engine", ("grpc", "clients", "sim", "doppelchip", "prometheus_client",
                           "smg_grpc_proto", "zmq", *service_modules())),
        ("server", ("clients", "sim", *FRONT_DOOR)),
        ("clients", ("server", "sim", *FRONT_DOOR)),
        # sim: the engine core, devices and the clients' workloads and reports, nothing served
        ("sim", ("asyncio", "grpc", "smg_grpc_proto", "zmq", *_sim_service_modules(),
                 *SERVING_CLIENTS, *FRONT_DOOR)),
    ],
)
def test_imports_point_down(folder, forbidden):
    assert files(folder)
    assert violations(folder, forbidden) == []


def test_fleet_file_parser_needs_only_the_engine():
    """sim/ reads fleet files with server.config (its [server] table: server.server_config);
    that is layering only while the parser imports nothing served."""
    allowed = ("server.engine", "server.config", "server.server_config")
    for module in ("config.py", "server_config.py"):
        found = {m for m in imports(ROOT / "server" / module, "server") if m.startswith("server")}
        assert found and all(any(m == a or m.startswith(a + ".") for a in allowed)
                             for m in found), (module, found)


def test_front_door_imports_layers_lazily():
    front = [ROOT / "doppelchip" / "cli.py", *sorted((ROOT / "doppelchip").glob("cmd_*.py"))]
    assert check(front, ("server", "clients", "devices", "sim"), top_level_only=True) == []
    # the wire code and the proto generator belong to no layer above them
    wire = [p for p in files("doppelchip") if p.parent.name == "v1" or p.name == "protogen.py"]
    assert check(wire, ("server", "clients", "devices", "sim")) == []
    loaded = subprocess.run(
        [sys.executable, "-c",
         "import sys, doppelchip.cli; print(sorted({m.split('.')[0] for m in sys.modules}))"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout
    for layer in ("server", "clients", "devices", "sim"):
        assert f"'{layer}'" not in loaded


def test_checker_sees_a_violation(tmp_path):
    """The checker itself must catch an upward import (so the tests above can fail)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import asyncio\nfrom server.engine import interface\n")
    found = {m for _, m in check([probe], ("asyncio", "server"))}
    assert {"asyncio", "server.engine"} <= found


def import_graph(paths: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports. `from pkg import sub` depends on the
    submodule `sub` (not on pkg's __init__, which Python has already begun to run); `from pkg
    import name` depends on pkg's __init__."""
    names = {module_name(p, root): p for p in paths}

    def known(module: str) -> str:
        while module and module not in names:
            module = module.rpartition(".")[0]
        return module

    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in _nodes(ast.parse(path.read_text(), str(path)), False):
            if isinstance(node, ast.Import):
                found.update(known(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, node.module] if node.module else up)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    found.add(sub if sub in names else known(base))
        graph[name] = {m for m in found if m and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    paths = [p for pkg in PACKAGES for p in files(pkg)]
    assert cycles(import_graph(paths)) == []


def test_cycle_finder_sees_a_cycle(tmp_path):
    """The cycle check itself must catch a cycle (so the test above can fail)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "x.py").write_text("def f():\n    from p import y\n")
    (tmp_path / "p" / "y.py").write_text("from p.x import f\n")
    found = import_graph([tmp_path / "p" / "x.py", tmp_path / "p" / "y.py"], root=tmp_path)
    assert cycles(found) == [["p.x", "p.y"]]  # a lazy import inside a function counts
