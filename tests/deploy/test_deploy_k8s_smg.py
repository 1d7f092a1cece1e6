"""smg/ is SGLang-shaped doppelchip pods behind the smg router in gRPC mode: the worker's
command line is one doppelchip's `sglang serve` translates into the ports its container,
probes and scrape annotation name; its probes ask gRPC health of SGLang's scheduler service;
smg's command line is the installed smg's, discovers exactly those pods on their gRPC port,
and its Role lets it read pods and nothing else."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_validation import API_DIRS, GENERATED, K8S, docs_of, errors_of, manifest_files

from doppelchip.cli import build_parser
from doppelchip.cmd_sglang import translate
from doppelchip.sglang_argv import sglang_argv
from server.sglang_servicer import SERVICE_NAME

SMG_DIR = K8S / "smg"
SMG = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def objects(name: str) -> dict[str, dict]:
    docs = docs_of(SMG_DIR / name)
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), kinds  # one of each kind per file
    return {d["kind"]: copy.deepcopy(d) for d in docs}


WORKER = objects("doppelchip-sglang-grpc.yaml")["Deployment"]
ROUTER = objects("smg.yaml")


def container(deployment: dict) -> dict:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def arg(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


def values(args: list[str], flag: str) -> list[str]:
    """A flag's values: what follows it up to the next flag."""
    i = args.index(flag) + 1
    end = next((j for j in range(i, len(args)) if args[j].startswith("--")), len(args))
    return args[i:end]


def port_number(c: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


def translated() -> list[str]:
    """`doppelchip serve`'s arguments for the worker container's `sglang serve ...`."""
    c = container(WORKER)
    assert c["command"] == ["sglang", "serve"]
    args = build_parser("sglang").parse_args(sglang_argv([*c["command"], *c["args"]]))
    out, warnings = translate(args)
    assert warnings == []  # every flag given means something here
    return out


def test_the_generic_schema_test_validates_every_smg_manifest_once():
    """test_deploy_k8s_schema.py validates (strict) and checks the kustomization of every
    directory in API_DIRS; smg/ must be one of them, listed once, and be generated."""
    assert API_DIRS.count("smg") == 1 and "smg" in GENERATED
    files = manifest_files()
    assert len(files) == len(set(files))
    present = sorted(f for f in SMG_DIR.glob("*.yaml") if f.name != "kustomization.yaml")
    assert [f.name for f in present] == ["doppelchip-sglang-grpc.yaml", "smg.yaml"]
    assert [f for f in files if f.parent == SMG_DIR] == present


def _named_grpc_port(d: dict) -> None:
    container(d)["readinessProbe"]["grpc"]["port"] = "grpc"  # kubelet dials numbers only


def _grpc_probe_with_a_path(d: dict) -> None:
    container(d)["livenessProbe"]["grpc"]["path"] = "/health"


def _verbs_as_a_string(d: dict) -> None:
    d["rules"][0]["verbs"] = "get,list,watch"


def _binding_without_a_role(d: dict) -> None:
    d.pop("roleRef")


def _env_from_an_unknown_field(d: dict) -> None:
    container(d)["env"][0]["valueFrom"]["fieldRef"]["path"] = "metadata.namespace"


BROKEN = [  # (what, file, kind, how, what the refusal names)
    ("named gRPC probe port", "doppelchip-sglang-grpc.yaml", "Deployment", _named_grpc_port,
     "port"),
    ("gRPC probe with a path", "doppelchip-sglang-grpc.yaml", "Deployment",
     _grpc_probe_with_a_path, "path"),
    ("Role verbs as a string", "smg.yaml", "Role", _verbs_as_a_string, "verbs"),
    ("RoleBinding without roleRef", "smg.yaml", "RoleBinding", _binding_without_a_role,
     "roleRef"),
    ("downward API misspelt", "smg.yaml", "Deployment", _env_from_an_unknown_field, "path"),
]


@pytest.mark.parametrize(("what", "name", "kind", "breaks", "named"), BROKEN,
                         ids=[b[0] for b in BROKEN])
def test_a_broken_smg_manifest_is_refused(what, name, kind, breaks, named):
    doc = objects(name)[kind]
    assert errors_of(doc) == []  # the committed one passes: the change below is what fails
    breaks(doc)
    errors = errors_of(doc)
    assert any(named in e for e in errors), (what, errors)


def test_the_worker_is_an_sglang_pod_with_grpc_on_port_and_http_on_port_plus_one():
    out = translated()
    assert arg(out, "--http-api") == "sglang"
    assert (arg(out, "--port"), arg(out, "--http-port")) == ("30000", "30001")
    assert "--enable-metrics" in out  # an SGLang pod serves /metrics only then
    assert arg(out, "--host") == "0.0.0.0"  # inside a container: every interface
    assert WORKER["spec"]["replicas"] == 2


def test_container_ports_probes_and_scrape_agree_with_the_translation():
    out = translated()
    grpc_port, http_port = int(arg(out, "--port")), int(arg(out, "--http-port"))
    c = container(WORKER)
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "grpc": grpc_port, "http": http_port}
    for kind in PROBES:
        assert "httpGet" not in c[kind], kind
        assert port_number(c, c[kind]["grpc"]["port"]) == grpc_port, kind
    notes = WORKER["spec"]["template"]["metadata"]["annotations"]
    assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": str(http_port),
                     "prometheus.io/path": "/metrics"}


def test_probes_ask_the_scheduler_service_and_liveness_the_whole_server():
    c = container(WORKER)
    assert c["startupProbe"]["grpc"]["service"] == SERVICE_NAME
    assert c["readinessProbe"]["grpc"]["service"] == SERVICE_NAME
    assert c["livenessProbe"]["grpc"]["service"] == ""  # SERVING from start to the drain


def test_the_worker_keeps_the_pods_files_numbers():
    """The comments say the probes' numbers, drain and resources are the pods/ files': the
    SGLang-shaped vLLM pod of the same model and chip is the reference."""
    (ref,) = (d for d in docs_of(K8S / "pods" / "sglang-h100.yaml") if d["kind"] == "Deployment")
    c, rc = container(WORKER), container(ref)
    for kind in PROBES:
        assert {k: v for k, v in c[kind].items() if k != "grpc"} == {
            k: v for k, v in rc[kind].items() if k != "httpGet"}, kind
    assert (c["lifecycle"], c["resources"]) == (rc["lifecycle"], rc["resources"])
    spec, ref_spec = WORKER["spec"]["template"]["spec"], ref["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == ref_spec["terminationGracePeriodSeconds"]
    assert (c["image"], c["imagePullPolicy"]) == (rc["image"], rc["imagePullPolicy"])
    labels = WORKER["spec"]["template"]["metadata"]["labels"]
    assert labels["app"] == WORKER["metadata"]["name"] == "doppelchip-sglang-grpc"
    assert {"app.kubernetes.io/name", "app.kubernetes.io/instance",
            "app.kubernetes.io/component"} <= labels.keys()
    assert WORKER["spec"]["selector"]["matchLabels"].items() <= labels.items()


def smg_flags() -> tuple[set[str], str]:
    """The installed smg's `launch` flags and its help text."""
    if SMG is None:
        pytest.skip("smg is not installed (the dev extra's `smg` wheel)")
    result = subprocess.run([SMG, "launch", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", result.stdout)), result.stdout


def test_every_smg_flag_is_one_of_the_installed_smg():
    flags, text = smg_flags()
    c = container(ROUTER["Deployment"])
    assert c["command"] == ["smg"] and c["args"][0] == "launch"
    given = [a for a in c["args"][1:] if a.startswith("--")]
    assert given and not set(given) - flags, set(given) - flags
    policies = re.search(r"--policy \{([^}]*)\}", text)
    assert policies and arg(c["args"], "--policy") in policies.group(1).split(",")


def test_smg_discovers_the_worker_pods_on_their_grpc_port():
    c = container(ROUTER["Deployment"])
    args = c["args"]
    assert "--service-discovery" in args and "--worker-urls" not in args
    labels = WORKER["spec"]["template"]["metadata"]["labels"]
    selector = dict(s.split("=", 1) for s in values(args, "--selector"))
    assert selector and selector.items() <= labels.items()
    assert selector == WORKER["spec"]["selector"]["matchLabels"]  # exactly this Deployment
    grpc = next(p["containerPort"] for p in container(WORKER)["ports"] if p["name"] == "grpc")
    assert int(arg(args, "--service-discovery-port")) == grpc
    assert int(arg(args, "--service-discovery-port")) == int(arg(translated(), "--port"))
    # the namespace the Role covers: this pod's own, from the downward API
    assert arg(args, "--service-discovery-namespace") == "$(POD_NAMESPACE)"
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.namespace"}}} in c["env"]


def test_smg_probes_ports_and_service_agree_with_its_args():
    d, svc = ROUTER["Deployment"], ROUTER["Service"]
    c = container(d)
    args = c["args"]
    port, metrics = int(arg(args, "--port")), int(arg(args, "--prometheus-port"))
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": port,
                                                                   "metrics": metrics}
    # paths smg serves (model_gateway/src/server.rs); /health would hide a workerless router
    assert c["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert c["livenessProbe"]["httpGet"]["path"] == "/liveness"
    for kind in ("readinessProbe", "livenessProbe"):
        assert port_number(c, c[kind]["httpGet"]["port"]) == port, kind
    assert arg(args, "--host") == "0.0.0.0" and arg(args, "--prometheus-host") == "0.0.0.0"
    notes = d["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/port"] == str(metrics)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    assert {p["name"]: (p["port"], port_number(c, p["targetPort"]))
            for p in svc["spec"]["ports"]} == {"http": (port, port),
                                               "metrics": (metrics, metrics)}
    assert d["spec"]["replicas"] == 1


def test_the_role_lets_smgs_account_read_pods_and_nothing_else():
    role, binding, account = ROUTER["Role"], ROUTER["RoleBinding"], ROUTER["ServiceAccount"]
    (rule,) = role["rules"]
    assert rule["apiGroups"] == [""] and rule["resources"] == ["pods"]
    assert sorted(rule["verbs"]) == ["get", "list", "watch"]
    assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no URLs
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    uses = ROUTER["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": uses}]
    assert account["metadata"]["name"] == uses
    # namespaced: a Role, not a ClusterRole, as --service-discovery-namespace watches one
    assert "ClusterRole" not in {d["kind"] for d in docs_of(SMG_DIR / "smg.yaml")}


def test_the_smg_image_is_the_pinned_smg_version():
    """The image tag follows the smg version the dev extra pins (pyproject.toml)."""
    import tomllib

    project = tomllib.loads((K8S.parents[1] / "pyproject.toml").read_text())["project"]
    pins = [p for deps in project["optional-dependencies"].values() for p in deps
            if re.fullmatch(r"smg==[\w.]+", p.split(";")[0].strip())]
    assert len(pins) == 1, pins
    version = pins[0].split("==")[1].strip()
    assert container(ROUTER["Deployment"])["image"] == f"docker.io/lightseekorg/smg:{version}"
