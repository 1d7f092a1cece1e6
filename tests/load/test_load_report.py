"""Sweeps, the HTML report and the live progress bar."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from html.parser import HTMLParser

import pytest
from fleets import TEST_FLEET
from server_proc import ServerProcess

from clients.server_metrics import scrape
from doppelchip.cli import main

WORKLOAD = ["--num-requests", "80", "--isl", "256", "--osl", "64", "--ignore-eos"]


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[str, bytes]] = []
        self.headings: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img" and a.get("src", "").startswith("data:image/png;base64,"):
            self.images.append((a.get("alt", ""), base64.b64decode(a["src"].split(",", 1)[1])))
        self._in_h2 = tag == "h2"

    def handle_data(self, data):
        if self._in_h2:
            self.headings.append(data)
            self._in_h2 = False


def test_sweep_finds_saturation_and_the_highest_rate_meeting_the_slo(capsys, tmp_path):
    html_path = tmp_path / "report.html"
    assert main(["load", "--target", "sim:", "--sweep-rates", "10,20,40,80,160,320,640",
                 *WORKLOAD, "--slo", "ttft=0.1", "--json", "--html", str(html_path)]) == 0
    s = json.loads(capsys.readouterr().out)
    rates = [p["offered_rate"] for p in s["sweep"]]
    assert rates == [10, 20, 40, 80, 160, 320, 640][: len(rates)]
    assert s["saturated_at"] == rates[-1] and len(rates) >= 3  # it stopped at saturation
    # saturated where achieved throughput departs from the offered rate, not before
    last = s["sweep"][-1]["steady"]
    assert last["achieved_over_offered"] < 0.9 or last["ttft_growth"] > 2
    assert all(p["steady"]["achieved_over_offered"] >= 0.9 for p in s["sweep"][:-1])
    assert s["bottleneck"]["kind"] in ("kv-capacity", "compute", "queueing", "compile-stalls")
    best = s["max_rate_meeting_slo"]
    passing = [p for p in s["sweep"][:-1] if p["steady"]["goodput_fraction"] >= 0.9]
    assert best == max(p["offered_rate"] for p in passing)
    assert all(p["num_requests"] >= 80 for p in s["sweep"])  # --num-requests is a minimum

    parser = _Images()
    parser.feed(html_path.read_text())
    assert [alt for alt, _ in parser.images] == [
        "Achieved rate and latency over the sweep",
        f"Latency distributions at {rates[-1]:g} req/s offered, the sweep's last point",
        f"Throughput over time at {rates[-1]:g} req/s offered, the sweep's last point"]
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
               for _, png in parser.images)
    assert "Conclusion" in parser.headings and "Sweep points" in parser.headings


def test_single_run_report_has_no_sweep_plot(capsys, tmp_path):
    html_path = tmp_path / "one.html"
    assert main(["load", "--target", "sim:", *WORKLOAD, "--rate", "20",
                 "--html", str(html_path)]) == 0
    parser = _Images()
    parser.feed(html_path.read_text())
    assert [alt for alt, _ in parser.images] == ["Latency distributions", "Throughput over time"]


async def test_progress_bar_counts_every_request(server, capsys):
    argv = ["load", "--target", server.target, "--deployment", "fast",
            "--num-requests", "6", "--isl", "16", "--osl", "4", "--ignore-eos", "--progress", "on"]
    assert await asyncio.to_thread(main, argv) == 0  # the server shares this test's loop
    err = capsys.readouterr().err
    assert "6/6" in err and "0 errors" in err


async def test_grpc_load_reports_energy_and_cost_from_the_server_metrics(capsys):
    """The load's joules and dollars per million tokens are the server's own energy and cost
    counters, read at the start and the end of the load: the readings it reports lie between
    two scrapes the test takes around the whole command (the counters only grow), and the
    rates are their difference over the output tokens. No wall-clock tolerance: the idle
    charges between scrapes depend on the host, these relations do not."""
    with ServerProcess(TEST_FLEET) as server:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        outer_before = await asyncio.to_thread(scrape, url, "fast")
        workload = ["--num-requests", "10", "--rate", "4", "--isl", "64", "--osl", "16",
                    "--ignore-eos", "--seed", "2"]
        argv = ["load", "--target", server.target, "--deployment", "fast", "--json",
                "--progress", "off", *workload]
        assert await asyncio.to_thread(main, argv) == 0
        outer_after = await asyncio.to_thread(scrape, url, "fast")
    real = json.loads(capsys.readouterr().out)
    assert real["output_tokens"] == 160
    before, after = real["server_counters"]["before"], real["server_counters"]["after"]
    for name, rate in (("doppelchip_energy_joules", "joules_per_mtok"),
                       ("doppelchip_cost_dollars", "usd_per_mtok")):
        assert outer_before[name] <= before[name] < after[name] <= outer_after[name], name
        assert real[rate] == pytest.approx((after[name] - before[name]) * 1e6 / 160, rel=1e-12)


def test_concurrency_sweep_stops_when_throughput_stops_growing(capsys):
    assert main(["load", "--target", "sim:", "--sweep-concurrency", "1,4,16,64,256,1024",
                 "--num-requests", "120", "--isl", "256", "--osl", "32", "--ignore-eos",
                 "--slo", "ttft=0.2", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    levels = [p["concurrency"] for p in s["sweep"]]
    tput = [p["output_tokens_per_s"] for p in s["sweep"]]
    assert levels == [1, 4, 16, 64, 256, 1024][: len(levels)] and s["saturated_at"] == levels[-1]
    assert all(b >= 1.05 * a for a, b in itertools.pairwise(tput[:-1]))
    assert tput[-1] < 1.05 * tput[-2]
    assert s["max_concurrency_meeting_slo"] in levels
