"""The plan's HTML report in a real headless browser (tests/load/browser.py's Chromium over the
DevTools pipe): every line the terminal prints is in the conclusion box that opens the page,
the frontier plot loaded, no console errors, no raw JSON."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from plan_grid import GRID, SLO, WORKLOAD

from doppelchip.cli import main

_spec = importlib.util.spec_from_file_location(
    "browser", Path(__file__).resolve().parents[1] / "load" / "browser.py")
browser_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(browser_mod)
CHROMIUM, WHY_NOT = browser_mod.find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=WHY_NOT)


def test_plan_report_says_what_the_terminal_says(tmp_path, capsys):
    html = tmp_path / "plan.html"
    assert main(["plan", *GRID, *WORKLOAD, "--slo", SLO, "--jobs", "1",
                 "--html", str(html)]) == 0
    terminal = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("winner: ") for line in terminal)
    b = browser_mod.Browser(CHROMIUM)
    try:
        b.open(html.as_uri())
        images = b.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
        assert images and all(done and width > 100 for done, width in images), images
        assert b.console_errors() == []
        assert b.evaluate("document.body.firstElementChild.nextElementSibling.id") \
            == "conclusion"
        conclusion = b.evaluate("document.getElementById('conclusion').innerText")
        for line in terminal:
            assert line.strip() in conclusion
        cells = b.evaluate("Array.from(document.querySelectorAll('#frontier td'))"
                           ".map(td => td.innerText)")
        assert cells and max(len(c) for c in cells if not c.count("×")) < 12
        assert "{" not in b.evaluate("document.body.innerText")  # no raw JSON
    finally:
        b.close()
