"""The inference-gateway example holds together: the pool selects the pods serving its model on
their HTTP port, its endpoint picker is reachable where the pool says and may read what it
needs, it reads vLLM series doppelchip exports, the route reaches the pool; the ServiceMonitor
scrapes every doppelchip Service; the shipped CRDs are the upstream files named in their README."""

from __future__ import annotations

import hashlib
import json
import re

from k8s_validation import K8S, ROOT, docs_of, load_all

from server.config import load_fleet

FLEET = load_fleet()
GATEWAY = K8S / "inference-gateway"
REFERENCE = json.loads((ROOT / "tests/observability/vllm_reference.json").read_text())


def one(rel: str, kind: str) -> dict:
    (doc,) = [d for d in docs_of(K8S / rel) if d["kind"] == kind]
    return doc


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def pod_templates() -> dict[str, dict[str, str]]:
    """Pod template labels of every generated pod, by file."""
    found = {}
    for rel in [f"pods/{d.name}.yaml" for d in FLEET.deployments] + ["fleet/fleet.yaml"]:
        found[rel] = one(rel, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return found


def test_the_pool_selects_the_pods_serving_its_model_on_their_http_port():
    pool = one("inference-gateway/inferencepool.yaml", "InferencePool")
    model = next(d.model for d in FLEET.deployments if d.name == FLEET.default_deployment)
    chosen = {rel for rel, labels in pod_templates().items()
              if selects(pool["spec"]["selector"]["matchLabels"], labels)}
    assert chosen == {f"pods/{d.name}.yaml" for d in FLEET.deployments if d.model == model}
    assert len(chosen) > 1  # a pool to route across, not one pod
    assert pool["spec"]["targetPorts"] == [{"number": FLEET.server.metrics_port}]
    assert pool["spec"]["appProtocol"] == "http"


def test_the_endpoint_picker_is_where_the_pool_points_and_picks_this_pool():
    pool = one("inference-gateway/inferencepool.yaml", "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    svc = one("inference-gateway/epp.yaml", "Service")
    epp = one("inference-gateway/epp.yaml", "Deployment")
    assert svc["metadata"]["name"] == ref["name"] and ref.get("kind", "Service") == "Service"
    assert ref["port"]["number"] in {p["port"] for p in svc["spec"]["ports"]}
    template = epp["spec"]["template"]
    assert selects(svc["spec"]["selector"], template["metadata"]["labels"])
    (c,) = template["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    assert args[args.index("--pool-group") + 1] == pool["apiVersion"].split("/")[0]
    assert int(args[args.index("--grpc-port") + 1]) == ref["port"]["number"]
    health = int(args[args.index("--grpc-health-port") + 1])
    assert c["readinessProbe"]["grpc"]["port"] == c["livenessProbe"]["grpc"]["port"] == health
    # its namespace comes from the NAMESPACE variable (the manifests are namespace-agnostic)
    assert "--pool-namespace" not in args
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}[
        "NAMESPACE"] == "metadata.namespace"


def test_the_endpoint_picker_may_watch_pods_and_the_pool():
    role, binding = one("inference-gateway/epp.yaml", "Role"), one(
        "inference-gateway/epp.yaml", "RoleBinding")
    sa = one("inference-gateway/epp.yaml", "ServiceAccount")["metadata"]["name"]
    epp = one("inference-gateway/epp.yaml", "Deployment")
    assert epp["spec"]["template"]["spec"]["serviceAccountName"] == sa
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]

    def allowed(group: str, resource: str) -> bool:
        return any(group in r["apiGroups"] and resource in r["resources"]
                   and {"get", "list", "watch"} <= set(r["verbs"]) for r in role["rules"])

    assert allowed("", "pods") and allowed("inference.networking.k8s.io", "inferencepools")


def test_the_endpoint_picker_reads_vllm_series_doppelchip_exports():
    epp = one("inference-gateway/epp.yaml", "Deployment")
    (c,) = epp["spec"]["template"]["spec"]["containers"]
    config_path = c["args"][c["args"].index("--config-file") + 1]
    mount = next(m for m in c["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in epp["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == mount["name"])
    config_map = one("inference-gateway/epp.yaml", "ConfigMap")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    (config,) = load_all(config_map["data"][config_path.rsplit("/", 1)[1]])
    plugins = {p["type"]: p.get("parameters", {}) for p in config["plugins"]}
    assert plugins["metrics-data-source"]["path"] == "/metrics"
    (engine,) = plugins["core-metrics-extractor"]["engineConfigs"]
    names = {k: v for k, v in engine.items() if k.endswith("Spec")}
    for spec, name in names.items():
        assert name in REFERENCE["series"], (spec, name)  # a vLLM 0.33.0 series
    scored = {names[k] for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec",
                                 "cacheInfoSpec")}
    assert scored <= set(REFERENCE["gauges"])  # exported by every doppelchip pod today
    profile = {p["pluginRef"] for p in config["schedulingProfiles"][0]["plugins"]}
    assert profile <= set(plugins)


def test_the_route_reaches_the_pool_through_the_gateway():
    route = one("inference-gateway/httproute.yaml", "HTTPRoute")
    pool = one("inference-gateway/inferencepool.yaml", "InferencePool")
    gateway = one("inference-gateway/gateway.yaml", "Gateway")
    (parent,) = route["spec"]["parentRefs"]
    assert parent["name"] == gateway["metadata"]["name"] and parent["kind"] == "Gateway"
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        pool["apiVersion"].split("/")[0], "InferencePool", pool["metadata"]["name"])


def test_the_service_monitor_scrapes_every_doppelchip_service():
    monitor = one("monitoring/servicemonitor.yaml", "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    # pods' vllm: series have no `deployment` label: the target's comes from the Service
    (relabel,) = endpoint["relabelings"]
    assert relabel["targetLabel"] == "deployment" and endpoint["honorLabels"] is True
    assert relabel["sourceLabels"] == [
        "__meta_kubernetes_service_label_app_kubernetes_io_instance"]
    rels = [f"pods/{d.name}.yaml" for d in FLEET.deployments] + ["fleet/fleet.yaml"]
    for rel in rels:
        svc = one(rel, "Service")
        assert selects(monitor["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
        if rel.startswith("pods/"):
            assert svc["metadata"]["labels"]["app.kubernetes.io/instance"] == \
                rel.removeprefix("pods/").removesuffix(".yaml")
        port = next(p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"])
        assert port["port"] == FLEET.server.metrics_port, rel
    epp_svc = one("inference-gateway/epp.yaml", "Service")
    assert not selects(monitor["spec"]["selector"]["matchLabels"], epp_svc["metadata"]["labels"])


def test_the_shipped_crds_are_the_upstream_files_their_readme_names():
    readme = (K8S / "crds" / "README.md").read_text()
    for path in sorted((K8S / "crds").glob("*.yaml")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        row = next((line for line in readme.splitlines() if path.name in line), "")
        assert digest in row, f"{path.name}: sha256 {digest} not in crds/README.md"
        (crd,) = docs_of(path)
        bundle = [v for k, v in crd["metadata"].get("annotations", {}).items()
                  if re.search(r"bundle-version|operator.prometheus.io/version", k)]
        assert bundle and any(v.lstrip("v") in row for v in bundle), path.name


def test_the_llm_d_values_point_its_router_at_the_pools_pods():
    (values,) = docs_of(K8S / "llm-d" / "values.yaml")
    servers = values["router"]["modelServers"]
    pool = one("inference-gateway/inferencepool.yaml", "InferencePool")
    assert servers["matchLabels"] == pool["spec"]["selector"]["matchLabels"]
    assert servers["targetPorts"] == pool["spec"]["targetPorts"]
    assert (servers["type"], servers["protocol"]) == ("vllm", "http")
    epp = one("inference-gateway/epp.yaml", "Deployment")
    image = epp["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(":" + values["router"]["epp"]["image"]["tag"])
