"""deploy/ is not run by CI (no Docker here), so check that its files agree with the code:
ports, the drain grace, what the image copies, where Prometheus scrapes. The Kubernetes
manifests have tests of their own (tests/deploy: generated from the fleet, schema-validated,
probes, pool and router wiring); here, only what the observability stack relies on."""

from __future__ import annotations

import re

import yaml
from obs_prometheus import ROOT

from server.config import load_fleet

DEPLOY = ROOT / "deploy"


def test_ports_and_probes_agree():
    server = load_fleet().server
    grpc, metrics = str(server.port), str(server.metrics_port)
    docker = (DEPLOY / "Dockerfile").read_text()
    assert f"EXPOSE {grpc} {metrics}" in docker
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert f"127.0.0.1:{grpc}:{grpc}" in compose and f"127.0.0.1:{metrics}:{metrics}" in compose
    assert f"doppelchip:{metrics}" in (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    pods = [*sorted((DEPLOY / "k8s" / "pods").glob("*.yaml")), DEPLOY / "k8s/fleet/fleet.yaml"]
    assert len(pods) > 2
    for path in pods:
        if path.name == "kustomization.yaml":
            continue
        (pod,) = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Deployment"]
        template = pod["spec"]["template"]
        notes = template["metadata"]["annotations"]  # Prometheus' kubernetes_sd pod role
        assert notes["prometheus.io/port"] == metrics and notes["prometheus.io/path"] == "/metrics"
        (container,) = template["spec"]["containers"]
        ports = {p["name"]: str(p["containerPort"]) for p in container["ports"]}
        assert ports == {"http": metrics, "grpc": grpc}, path.name  # /metrics on the HTTP port
        assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        assert template["spec"]["terminationGracePeriodSeconds"] > server.drain_grace_s


def test_image_copies_every_package():
    docker = (DEPLOY / "Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.findall(r'"(\w+)\*"', pyproject.split('include = [')[1].split("]")[0])
    assert {"doppelchip", "server", "devices", "clients", "sim"} <= set(packages)
    for pkg in packages:  # every package pip installs (sim/ was missing: serve's pod mode)
        assert f"COPY {pkg} ./{pkg}" in docker, pkg
