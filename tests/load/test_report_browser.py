"""The HTML reports in a real headless browser (Debian's chromium over the DevTools pipe):
the conclusion is in the DOM, every image loaded, no console errors."""

from __future__ import annotations

import pytest
from browser import Browser, find_chromium

from doppelchip.cli import main

CHROMIUM, WHY_NOT = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=WHY_NOT)

IMAGES = """Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])"""


@pytest.fixture(scope="module")
def browser():
    b = Browser(CHROMIUM)
    yield b
    b.close()


def _check(browser, path) -> str:
    browser.events.clear()
    browser.open(path.as_uri())
    images = browser.evaluate(IMAGES)
    assert images and all(done and width > 100 for _, done, width in images), images
    assert browser.console_errors() == []
    return browser.evaluate("document.getElementById('conclusion').innerText")


def test_sweep_report_opens_with_its_conclusion(browser, tmp_path, capsys):
    html = tmp_path / "sweep.html"
    assert main(["load", "--target", "sim:", "--sweep-rates", "10,40,160,640",
                 "--num-requests", "60", "--isl", "256", "--osl", "64", "--ignore-eos",
                 "--slo", "ttft=0.1", "--html", str(html)]) == 0
    terminal = capsys.readouterr().out.splitlines()
    conclusion = _check(browser, html)
    # every conclusion the terminal prints is in the page, in the conclusion box at the top
    said = [line for line in terminal if line.startswith(("saturated", "highest", "bottleneck"))]
    assert len(said) == 3
    assert all(line in conclusion for line in said)
    assert "per million output tokens" in conclusion
    assert browser.evaluate("document.body.firstElementChild.nextElementSibling.id") \
        == "conclusion"
    cells = browser.evaluate("Array.from(document.querySelectorAll('#sweep td'))"
                             ".map(td => td.innerText)")
    assert cells and max(len(c) for c in cells) < 12  # formatted, no 16-digit floats
    assert "{" not in browser.evaluate("document.body.innerText")  # no raw JSON


def test_whatif_report_has_every_terminal_conclusion(browser, tmp_path, capsys):
    assert main(["whatif", "--batches", "1,16", "--isl", "128", "--osl", "32",
                 "--out", str(tmp_path)]) == 0
    terminal = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    conclusion = _check(browser, tmp_path / "whatif.html")
    lines = [line.strip() for line in conclusion.splitlines() if line.strip()]
    assert all(line in lines for line in terminal), set(terminal) - set(lines)
