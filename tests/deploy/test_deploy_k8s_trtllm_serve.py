"""trtllm-serve/ is TensorRT-LLM-shaped doppelchip pods behind their own InferencePool: the
container's command line, with its ConfigMap's YAML as --config, is one doppelchip's
`trtllm-serve` translates into a pod serving trtllm-serve's HTTP API and Prometheus metrics on the
port its probes, Service and pool name; the pool takes exactly these pods (and inference-gateway/'s
pool none of them); its endpoint picker reads llm-d-router's `trtllm-serve` engine on the path
TensorRT-LLM serves it; and the command, run here, serves every series the picker reads."""

from __future__ import annotations

import copy
import json
import os
import urllib.request
from pathlib import Path

import pytest
from k8s_validation import API_DIRS, GENERATED, K8S, ROOT, docs_of, load_all, manifest_files
from prometheus_client.parser import text_string_to_metric_families
from server_proc import TrtllmServe

from doppelchip.cli import build_parser
from doppelchip.cmd_trtllm import translate

DIR = K8S / "trtllm-serve"
REFERENCE = json.loads((ROOT / "tests/observability/trtllm_reference.json").read_text())
PICKER = REFERENCE["llm_d_router"]
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def objects(name: str) -> dict[str, dict]:
    docs = docs_of(DIR / name)
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), kinds  # one of each kind per file
    return {d["kind"]: copy.deepcopy(d) for d in docs}


PODS = objects("doppelchip-trtllm-serve.yaml")
DEPLOYMENT, SERVICE, CONFIG_MAP = PODS["Deployment"], PODS["Service"], PODS["ConfigMap"]
POOL = objects("inferencepool.yaml")["InferencePool"]
EPP = objects("epp.yaml")


def objects_of(rel: str, kind: str) -> dict:
    (doc,) = [d for d in docs_of(K8S / rel) if d["kind"] == kind]
    return doc


def container(deployment: dict) -> dict:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def arg(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


def port_number(c: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


def config_file(tmp_path: Path) -> tuple[str, Path]:
    """The container's --config path, and the ConfigMap's file it mounts, written to tmp_path."""
    c = container(DEPLOYMENT)
    path = arg(c["args"], "--config")
    mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volumes = DEPLOYMENT["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == CONFIG_MAP["metadata"]["name"]
    local = tmp_path / "config.yaml"
    local.write_text(CONFIG_MAP["data"][path.removeprefix(mount["mountPath"] + "/")])
    return path, local


def container_argv(tmp_path: Path, **flags: str) -> list[str]:
    """The container's `trtllm-serve` arguments, the ConfigMap's YAML at a local path and
    `flags` (`grpc_port="0"` for --grpc-port) replacing or added to the container's."""
    c = container(DEPLOYMENT)
    assert c["command"] == ["trtllm-serve"]
    path, local = config_file(tmp_path)
    argv = [str(local) if a == path else a for a in c["args"]]
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def translated(tmp_path: Path) -> tuple[list[str], list[str]]:
    return translate(build_parser("trtllm-serve").parse_args(
        ["trtllm-serve", *container_argv(tmp_path)]))


@pytest.fixture(autouse=True)
def image_environment(monkeypatch):
    """The image sets DOPPELCHIP_HOST only (the command line gives --host anyway)."""
    for name in [k for k in os.environ if k.startswith("DOPPELCHIP_")]:
        monkeypatch.delenv(name)


def test_the_generic_schema_test_validates_every_trtllm_serve_manifest_once():
    """test_deploy_k8s_schema.py validates (strict) and checks the kustomization of every
    directory in API_DIRS; trtllm-serve/ must be one of them, listed once, and generated."""
    assert API_DIRS.count("trtllm-serve") == 1 and "trtllm-serve" in GENERATED
    files = manifest_files()
    assert len(files) == len(set(files))
    present = sorted(f for f in DIR.glob("*.yaml") if f.name != "kustomization.yaml")
    assert [f.name for f in present] == ["doppelchip-trtllm-serve.yaml", "epp.yaml",
                                         "gateway.yaml", "httproute.yaml", "inferencepool.yaml"]
    assert [f for f in files if f.parent == DIR] == present


def test_the_container_is_a_trtllm_serve_http_pod_with_metrics_on_its_http_port(tmp_path):
    """`trtllm-serve MODEL ... --config FILE` (no --grpc): trtllm-serve's HTTP server on
    --port, and the YAML's return_perf_metrics / enable_iter_perf_stats turn on the pod's
    /prometheus/metrics; every key of the YAML means something here."""
    out, warnings = translated(tmp_path)
    assert arg(out, "--http-api") == "trtllm" and "--grpc-api" not in out
    assert "--enable-metrics" in out
    c = container(DEPLOYMENT)
    assert arg(out, "--http-port") == arg(c["args"], "--port") == "8000"
    assert arg(out, "--host") == "0.0.0.0"  # inside a container: every interface
    assert arg(out, "--served-model-name") == c["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert arg(out, "--model") == "llama-3.1-8b"
    assert not [w for w in warnings if "not emulated" in w or "--config" in w], warnings
    assert DEPLOYMENT["spec"]["replicas"] == 2


def test_ports_probes_service_and_pool_agree_with_the_translation(tmp_path):
    out, _ = translated(tmp_path)
    http, grpc = int(arg(out, "--http-port")), int(arg(out, "--port"))
    c = container(DEPLOYMENT)
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": http, "grpc": grpc}
    for kind in PROBES:
        probe = c[kind]["httpGet"]
        assert probe["path"] == "/health", kind  # trtllm-serve's: 200 once the model serves
        assert port_number(c, probe["port"]) == http, kind
    notes = DEPLOYMENT["spec"]["template"]["metadata"]["annotations"]
    assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": str(http),
                     "prometheus.io/path": PICKER["scrape_path"]}
    assert {p["name"]: (p["port"], port_number(c, p["targetPort"]))
            for p in SERVICE["spec"]["ports"]} == {"http": (http, http), "grpc": (grpc, grpc)}
    assert POOL["spec"]["targetPorts"] == [{"number": http}]
    assert POOL["spec"]["appProtocol"] == "http"


def pod_templates() -> dict[str, dict[str, str]]:
    """The pod template labels of every generated Deployment running a doppelchip image."""
    found = {}
    for path in manifest_files():
        for doc in docs_of(path):
            if doc["kind"] == "Deployment" and "doppelchip" in container(doc)["image"]:
                name = f"{path.relative_to(K8S)}:{doc['metadata']['name']}"
                found[name] = doc["spec"]["template"]["metadata"]["labels"]
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_pool_selects_exactly_these_pods_and_the_other_pool_none_of_them():
    templates = pod_templates()
    here = "trtllm-serve/doppelchip-trtllm-serve.yaml:doppelchip-trtllm-serve"
    assert here in templates and len(templates) > 2
    chosen = {n for n, labels in templates.items()
              if selects(POOL["spec"]["selector"]["matchLabels"], labels)}
    assert chosen == {here}
    other = objects_of("inference-gateway/inferencepool.yaml", "InferencePool")
    assert not selects(other["spec"]["selector"]["matchLabels"], templates[here])
    labels = templates[here]
    assert labels["llm-d.ai/engine-type"] == PICKER["engine"]
    assert labels["app.kubernetes.io/component"] == "model-server"
    assert selects(SERVICE["spec"]["selector"], labels)
    assert selects(DEPLOYMENT["spec"]["selector"]["matchLabels"], labels)


def epp_config() -> dict:
    c = container(EPP["Deployment"])
    path = arg(c["args"], "--config-file")
    mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    (volume,) = [v for v in EPP["Deployment"]["spec"]["template"]["spec"]["volumes"]
                 if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == EPP["ConfigMap"]["metadata"]["name"]
    (config,) = load_all(EPP["ConfigMap"]["data"][path.rsplit("/", 1)[1]])
    return config


def plugins() -> dict[str, dict]:
    return {p["type"]: p.get("parameters", {}) for p in epp_config()["plugins"]}


def test_the_picker_reads_llm_d_routers_trtllm_serve_engine_on_its_scrape_path():
    found = plugins()
    assert found["metrics-data-source"]["path"] == PICKER["scrape_path"]
    extractor = found["core-metrics-extractor"]
    assert extractor["defaultEngine"] == PICKER["engine"]
    (engine,) = extractor["engineConfigs"]
    assert engine == {"name": PICKER["engine"],
                      **{k: v for k, v in PICKER.items() if k.endswith("Spec")}}
    profile = {p["pluginRef"] for p in epp_config()["schedulingProfiles"][0]["plugins"]}
    assert profile <= set(found)


def test_the_picker_picks_this_pool_and_the_route_reaches_it_through_its_own_gateway():
    ref = POOL["spec"]["endpointPickerRef"]
    assert EPP["Service"]["metadata"]["name"] == ref["name"]
    assert ref["port"]["number"] in {p["port"] for p in EPP["Service"]["spec"]["ports"]}
    args = container(EPP["Deployment"])["args"]
    assert arg(args, "--pool-name") == POOL["metadata"]["name"]
    other = objects_of("inference-gateway/epp.yaml", "Deployment")
    assert container(EPP["Deployment"])["image"] == container(other)["image"]  # one release
    route = objects_of("trtllm-serve/httproute.yaml", "HTTPRoute")
    gateway = objects_of("trtllm-serve/gateway.yaml", "Gateway")
    (parent,) = route["spec"]["parentRefs"]
    assert parent["name"] == gateway["metadata"]["name"]
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["kind"], backend["name"]) == ("InferencePool", POOL["metadata"]["name"])


def test_no_object_shares_a_name_with_inference_gateways():
    """Both examples apply side by side in one namespace."""
    def named(directory: str) -> set[tuple[str, str]]:
        return {(d["kind"], d["metadata"]["name"]) for f in (K8S / directory).glob("*.yaml")
                if f.name != "kustomization.yaml" for d in docs_of(f)}

    assert not named("trtllm-serve") & named("inference-gateway")


def test_the_service_monitor_leaves_the_trtllm_serve_service_alone():
    """monitoring/'s ServiceMonitor scrapes /metrics, here TensorRT-LLM's iteration-stats JSON."""
    monitor = objects_of("monitoring/servicemonitor.yaml", "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert not selects(monitor["spec"]["selector"]["matchLabels"], SERVICE["metadata"]["labels"])


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def test_the_containers_command_serves_every_series_the_picker_reads(tmp_path):
    """The container's command line run here (free ports on loopback, the ConfigMap's YAML):
    the picker's scrape path on the HTTP port answers, and each series its config names has one
    sample labelled as TensorRT-LLM labels its gauges."""
    argv = container_argv(tmp_path, host="127.0.0.1", port="0", grpc_port="0")
    specs = {k: v for k, v in plugins()["core-metrics-extractor"]["engineConfigs"][0].items()
             if k.endswith("Spec")}
    assert len(specs) == 5
    with TrtllmServe(None, *argv) as pod:
        assert get(f"{pod.http_url}/health")[0] == 200
        status, text = get(pod.http_url + plugins()["metrics-data-source"]["path"])
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for spec, name in specs.items():
            assert name in families, (spec, name)
            (sample,) = families[name].samples
            assert set(sample.labels) == {"engine_type", "model_name", "pid"}, name
            assert sample.labels["model_name"] == argv[0]
