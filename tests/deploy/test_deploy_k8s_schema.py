"""The generated manifests are what deploy/k8s/generate.py writes from the fleet, every one of
them passes the schema the API server would apply, and a broken one is refused."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from k8s_validation import API_DIRS, GENERATED, K8S, docs_of, errors_of, manifest_files

GENERATOR = K8S / "generate.py"


def run_generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True,
                          text=True, timeout=120)


def test_committed_manifests_are_the_generators_output():
    result = run_generator("--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_names_a_stale_a_missing_and_an_extra_file(tmp_path: Path):
    for d in GENERATED:
        shutil.copytree(K8S / d, tmp_path / d)
    assert run_generator("--check", "--out", str(tmp_path)).returncode == 0
    pod = tmp_path / "pods" / "vllm-h100.yaml"
    pod.write_text(pod.read_text().replace("timeoutSeconds: 3", "timeoutSeconds: 1"))
    (tmp_path / "fleet" / "fleet.yaml").unlink()
    (tmp_path / "pods" / "retired-deployment.yaml").write_text("kind: Deployment\n")
    result = run_generator("--check", "--out", str(tmp_path))
    assert result.returncode == 1
    for name in ("pods/vllm-h100.yaml", "fleet/fleet.yaml", "pods/retired-deployment.yaml"):
        assert name in result.stdout
    assert run_generator("--out", str(tmp_path)).returncode == 0  # regenerating repairs all
    assert run_generator("--check", "--out", str(tmp_path)).returncode == 0
    assert not (tmp_path / "pods" / "retired-deployment.yaml").exists()


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_manifest_validates(path: Path):
    docs = docs_of(path)
    assert docs
    for doc in docs:
        assert errors_of(doc) == [], f"{path.name}: {doc['kind']} {doc['metadata']['name']}"


def test_kustomizations_list_exactly_their_directory():
    for d in API_DIRS:
        (kustomization,) = docs_of(K8S / d / "kustomization.yaml")
        listed = sorted(kustomization["resources"])
        present = sorted(f.name for f in (K8S / d).glob("*.yaml") if f.name != "kustomization.yaml")
        assert listed == present, d


def _doc(rel: str, kind: str) -> dict:
    return copy.deepcopy(next(d for d in docs_of(K8S / rel) if d["kind"] == kind))


def _container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def _set(doc: dict, fn: Callable[[dict], None]) -> dict:
    fn(doc)
    return doc


# (what is wrong, the file and kind it is done to, how, what the refusal must name)
BROKEN = [
    ("probe timeout as a string", "pods/vllm-h100.yaml", "Deployment",
     lambda d: _container(d)["readinessProbe"].update(timeoutSeconds="3"), "timeoutSeconds"),
    ("misspelt probe field (strict: unknown fields refused)", "pods/vllm-h100.yaml",
     "Deployment", lambda d: _container(d).update(readinesProbe=_container(d)["readinessProbe"]),
     "readinesProbe"),
    ("container port as a string", "pods/vllm-h100.yaml", "Deployment",
     lambda d: _container(d)["ports"][0].update(containerPort="8000"), "containerPort"),
    ("Service ports not a list", "pods/vllm-h100.yaml", "Service",
     lambda d: d["spec"].update(ports={"name": "http", "port": 8000}), "spec.ports"),
    ("Service name with a dot", "pods/vllm-h100.yaml", "Service",
     lambda d: d["metadata"].update(name="doppelchip-llama-3.1-8b"), "metadata.name"),
    ("label value with a space", "pods/vllm-h100.yaml", "Deployment",
     lambda d: d["metadata"]["labels"].update({"llm-d.ai/model": "llama 3"}), "llm-d.ai/model"),
    ("InferencePool target port 0", "inference-gateway/inferencepool.yaml", "InferencePool",
     lambda d: d["spec"]["targetPorts"][0].update(number=0), "targetPorts.0.number"),
    ("InferencePool without a selector", "inference-gateway/inferencepool.yaml",
     "InferencePool", lambda d: d["spec"].pop("selector"), "'selector' is a required"),
    ("InferencePool misspelt field", "inference-gateway/inferencepool.yaml", "InferencePool",
     lambda d: d["spec"].update(endpointPickerRefs=d["spec"]["endpointPickerRef"]),
     "endpointPickerRefs"),
    ("InferencePool unknown failure mode", "inference-gateway/inferencepool.yaml",
     "InferencePool", lambda d: d["spec"]["endpointPickerRef"].update(failureMode="Open"),
     "failureMode"),
    ("HTTPRoute path type not in the enum", "inference-gateway/httproute.yaml", "HTTPRoute",
     lambda d: d["spec"]["rules"][0]["matches"][0]["path"].update(type="Prefix"), "path.type"),
    ("HTTPRoute timeout not a duration", "inference-gateway/httproute.yaml", "HTTPRoute",
     lambda d: d["spec"]["rules"][0]["timeouts"].update(request="five minutes"),
     "timeouts.request"),
    ("Gateway listener port 0", "inference-gateway/gateway.yaml", "Gateway",
     lambda d: d["spec"]["listeners"][0].update(port=0), "listeners.0.port"),
    ("ServiceMonitor interval not a duration", "monitoring/servicemonitor.yaml",
     "ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(interval="5 seconds"),
     "endpoints.0.interval"),
    ("unknown API version", "inference-gateway/inferencepool.yaml", "InferencePool",
     lambda d: d.update(apiVersion="inference.networking.k8s.io/v9"), "Couldn't find schema"),
]


@pytest.mark.parametrize(("what", "rel", "kind", "breaks", "named"), BROKEN,
                         ids=[b[0] for b in BROKEN])
def test_a_broken_manifest_is_refused(what: str, rel: str, kind: str, breaks, named: str):
    doc = _doc(rel, kind)
    assert errors_of(doc) == []  # the committed one passes: the change below is what fails
    errors = errors_of(_set(doc, breaks))
    assert any(named in e for e in errors), (what, errors)
