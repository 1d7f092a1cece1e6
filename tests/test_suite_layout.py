"""The test suite's own layout rule: conftest.py files hold fixtures, and no module imports
one. tests/ is not a package, so pytest imports every conftest.py as the module `conftest`,
each replacing the one before in sys.modules; a `from conftest import ...` collected after
tests/docs/conftest.py got that file instead of tests/conftest.py (CI failed to collect 34
modules). What tests share by import lives in named modules (fleets.py, server_proc.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def conftest_imports(root: Path) -> list[str]:
    """`file:line` of every import of a module named conftest below `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if any(n.split(".")[-1] == "conftest" for n in names):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_module_imports_a_conftest():
    assert conftest_imports(TESTS) == []


def test_the_check_sees_an_import_of_conftest(tmp_path):
    (tmp_path / "test_x.py").write_text("import os\nfrom conftest import TEST_FLEET\n")
    (tmp_path / "test_y.py").write_text("import conftest\n")
    assert conftest_imports(tmp_path) == ["test_x.py:2", "test_y.py:1"]
