"""Render the dashboards' queries as SVG charts, without Grafana (docs/img/*.svg).

    .venv/bin/python scripts/render_dashboards.py [--seconds 40]

Runs the observability test fleet (tests/observability/obs_load.py) under a steady load for
`--seconds`, with a real Prometheus (scripts/fetch_prometheus.sh) scraping it every second on
127.0.0.1, then evaluates every panel query of deploy/grafana/generate.py over that window
(`query_range`, `$deployment` = every deployment, `$__rate_interval` = 10s) and draws each
panel as a small line chart: the same queries a Grafana would show, plotted honestly.
A development tool (needs the dev extras); not run by the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import importlib.util
import itertools
import math
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "observability")]

import obs_load  # noqa: E402
from obs_prometheus import Prometheus, free_port, running_prometheus  # noqa: E402

from clients.client import AsyncClient  # noqa: E402
from server.app import App  # noqa: E402

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
W, H, PAD = 440, 220, 34


async def steady_load(client: AsyncClient, seconds: float) -> None:
    """Each deployment's requests, repeated by one worker per request until time is up."""
    end = time.monotonic() + seconds

    async def worker(deployment: str, prompt: str, n: int) -> None:
        for i in itertools.count():
            if time.monotonic() > end:
                return
            await obs_load.one(client, deployment, f"{prompt} {i}", min(n, 200))

    await asyncio.gather(*(worker(d, p, n) for d, reqs in obs_load.LOAD.items()
                           for p, n in reqs))


def series(prom: Prometheus, expr: str, legend: str, start: float,
           end: float) -> list[tuple[str, list]]:
    data = prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                    step="2")
    out = []
    for r in data["result"]:
        points = [(float(t), float(v)) for t, v in r["values"] if math.isfinite(float(v))]
        metric = r["metric"]
        label = re.sub(r"\{\{(\w+)\}\}", lambda m, mt=metric: mt.get(m.group(1), ""), legend)
        if points:
            out.append((label, points))
    return out


def chart(title: str, lines: list[tuple[str, list]], start: float, end: float) -> str:
    ys = [v for _, pts in lines for _, v in pts] or [0.0]
    top = max(ys) or 1.0
    positive = [v for v in ys if v > 0]
    low = min(positive) if positive else 0.0
    log = bool(positive) and min(ys) >= 0 and top / low > 1000  # spans decades: log scale

    def y(v: float) -> float:
        frac = (math.log10(max(v, low)) - math.log10(low)) / (math.log10(top) - math.log10(low)) \
            if log else v / top
        return H - 14 - frac * (H - PAD - 20)

    parts = [f'<rect width="{W}" height="{H}" fill="white" stroke="#ccc"/>',
             f'<text x="8" y="16" font-size="12" font-weight="bold">{html.escape(title)}</text>',
             f'<text x="4" y="{PAD}" font-size="9">{top:.3g}</text>',
             f'<text x="4" y="{H - 6}" font-size="9">{f"{low:.3g} (log)" if log else "0"}</text>']
    for i, (label, pts) in enumerate(lines[:10]):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(
            f"{PAD + (t - start) / max(end - start, 1) * (W - PAD - 8):.1f},"
            f"{y(v):.1f}" for t, v in pts)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{path}"/>')
        parts.append(f'<text x="{PAD + 4}" y="{30 + 10 * i}" font-size="8" fill="{colour}">'
                     f"{html.escape(label[:70])}</text>")
    if not lines:
        parts.append(f'<text x="{W / 2 - 20}" y="{H / 2}" font-size="11">no data</text>')
    return "".join(parts)


def render(board: dict, prom: Prometheus, start: float, end: float, deployments: str) -> str:
    cells = []
    for i, panel in enumerate(board["panels"]):
        lines = []
        for target in panel["targets"]:
            expr = (target["expr"].replace("$deployment", deployments)
                    .replace("$__rate_interval", "10s"))
            lines += series(prom, expr, target["legendFormat"], start, end)
        x, y = (i % 2) * (W + 10), (i // 2) * (H + 10)
        cells.append(f'<g transform="translate({x},{y})">'
                     f"{chart(panel['title'], lines, start, end)}</g>")
    rows = (len(board["panels"]) + 1) // 2
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W + 10}" '
            f'height="{rows * (H + 10)}" font-family="sans-serif">{"".join(cells)}</svg>\n')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("generate", ROOT / "deploy/grafana/generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, \
            running_prometheus([f"127.0.0.1:{port}"], Path(tmp), "1s") as prom:

        async def run() -> tuple[float, float]:
            app = App(obs_load.fleet(port).with_server(time_scale=0.01))
            await app.start()
            try:
                await asyncio.to_thread(prom.wait_scraped_after, 0.0)
                start = time.time()
                async with AsyncClient(f"127.0.0.1:{app.port}") as client:
                    for engine in app.fleet.engines.values():
                        await engine.until_ready()
                    await steady_load(client, args.seconds)
                return start, await asyncio.to_thread(prom.wait_scraped_after, time.time())
            finally:
                await app.drain(0.0)

        start, end = asyncio.run(run())
        args.out.mkdir(parents=True, exist_ok=True)
        for name, build in gen.DASHBOARDS.items():
            path = args.out / name.replace(".json", ".svg")
            path.write_text(render(build(), prom, start, end, "|".join(obs_load.LOAD)))
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
