"""deploy/ is not run by CI (no Docker here), so check that its files agree with the code:
ports, the health service the probes ask for, the drain grace, what the image copies."""

from __future__ import annotations

from obs_prometheus import ROOT

from server.app import SERVICE_NAME
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
    k8s = (DEPLOY / "k8s" / "deployment.yaml").read_text()
    assert f"grpc: {{port: {grpc}, service: {SERVICE_NAME}}}" in k8s  # readiness
    assert f"grpc: {{port: {grpc}}}" in k8s  # liveness: the server as a whole
    assert f'prometheus.io/port: "{metrics}"' in k8s
    grace = int(k8s.split("terminationGracePeriodSeconds:")[1].split()[0])
    assert grace > server.drain_grace_s


def test_image_copies_every_package():
    docker = (DEPLOY / "Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = pyproject.split('include = [')[1].split("]")[0]
    for pkg in ("doppelchip", "server", "devices", "clients"):
        assert f'"{pkg}*"' in packages
        assert f"COPY {pkg} ./{pkg}" in docker
