"""The committed dashboards are exactly what deploy/grafana/generate.py produces, and hold
together: unique ids, every query uses the deployment variable, no fallbacks."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from obs_prometheus import ROOT

GRAFANA = ROOT / "deploy" / "grafana"


def test_committed_json_is_fresh():
    result = subprocess.run([sys.executable, str(GRAFANA / "generate.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_are_well_formed():
    files = sorted((GRAFANA / "dashboards").glob("*.json"))
    assert [f.name for f in files] == ["devices.json", "serving.json"]
    uids = set()
    for f in files:
        board = json.loads(f.read_text())
        uids.add(board["uid"])
        variables = {v["name"] for v in board["templating"]["list"]}
        assert {"datasource", "deployment"} <= variables
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            assert panel["description"] and panel["targets"], panel["title"]
            for target in panel["targets"]:
                expr = target["expr"]
                assert '$deployment' in expr, (panel["title"], expr)
                assert not re.search(r"\bor\b|vector\(", expr), (panel["title"], expr)
    assert len(uids) == 2


def test_provisioning_points_at_the_dashboards():
    provider = (GRAFANA / "provisioning" / "dashboards" / "doppelchip.yml").read_text()
    compose = (ROOT / "deploy" / "docker-compose.yml").read_text()
    assert "path: /var/lib/grafana/dashboards" in provider
    assert "./grafana/dashboards:/var/lib/grafana/dashboards" in compose
    datasource = (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "url: http://prometheus:9090" in datasource
