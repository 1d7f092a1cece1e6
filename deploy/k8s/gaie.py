"""The inference-gateway example: an InferencePool over doppelchip pods, its endpoint picker
(EPP) and a Gateway API HTTPRoute to it.

Followed (docs/ROUTERS.md records the same):
- InferencePool `inference.networking.k8s.io/v1`: Gateway API Inference Extension (GAIE)
  v1.6.0 (commit 992e5c29), config/crd/bases and conformance/resources/base.yaml. From v1.6.0
  GAIE hosts only the API and a lightweight round-robin picker; its README names
  llm-d/llm-d-router as the endpoint picker's home.
- The endpoint picker: llm-d/llm-d-router v0.10.0 (commit 71f4f099), its Helm chart
  `llm-d-router-gateway` rendered by hand (config/charts/routerlib/templates: the Deployment,
  Service, RBAC and default-plugins.yaml) with the image its release names,
  ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0. What it reads from each pod:
  pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go (the `vllm` engine).
- Gateway and HTTPRoute `gateway.networking.k8s.io/v1`: Gateway API v1.6.1 (what GAIE v1.6.0's
  conformance suite requires), shaped as llm-d-router's chart and manifests write them.
"""

from __future__ import annotations

from emit import Doc, dump

from server.config import FleetConfig

EPP_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT = 9002, 9003, 9090
GATEWAY = "inference-gateway"
POOL_GROUP = "inference.networking.k8s.io"

# What the endpoint picker reads from each pod's /metrics (llm-d-router v0.10.0's built-in
# `vllm` engine config, spelled out; the --*-metric flags are deprecated in its favour).
VLLM_ENGINE = {
    "name": "vllm",
    "queuedRequestsSpec": "vllm:num_requests_waiting",
    "runningRequestsSpec": "vllm:num_requests_running",
    "kvUsageSpec": "vllm:kv_cache_usage_perc",
    "loraSpec": "vllm:lora_requests_info",  # skipped silently while a pod has no LoRA
    "cacheInfoSpec": "vllm:cache_config_info",  # block_size, num_gpu_blocks labels
}


def epp_config(metrics_path: str, engine: dict[str, str] = VLLM_ENGINE) -> str:
    """The chart's default-plugins.yaml over HTTP: queue, KV-usage and prefix-cache scorers
    weighted 2/2/3, fed by scraping each pod's `metrics_path` and reading `engine`'s series
    (its name the default engine: a pod without an llm-d.ai/engine-type label reads them)."""
    import yaml

    doc = {
        "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
            {"type": "prefix-cache-scorer"},
            {"type": "metrics-data-source", "parameters": {
                "scheme": "http", "path": metrics_path, "insecureSkipVerify": True}},
            {"type": "core-metrics-extractor", "parameters": {
                "defaultEngine": engine["name"], "engineConfigs": [engine]}},
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "queue-scorer", "weight": 2},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
            {"pluginRef": "prefix-cache-scorer", "weight": 3}]}],
    }
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)


def _meta(name: str) -> Doc:
    return {"name": name, "labels": {"app.kubernetes.io/name": name}}


def epp_objects(pool: str, epp: str, metrics_path: str = "/metrics",
                engine: dict[str, str] = VLLM_ENGINE) -> list[Doc]:
    """The endpoint picker of `pool`, named `epp`, as llm-d-router's gateway chart renders it:
    ServiceAccount, Role, RoleBinding, its config (epp_config) as a ConfigMap, Deployment and
    Service."""
    read = ["get", "watch", "list"]
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
        {"apiGroups": ["inference.networking.x-k8s.io", "llm-d.ai"],
         "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": read},
    ]
    health = {"grpc": {"port": HEALTH_PORT, "service": "inference-extension"}}
    container = {
        "name": "epp", "image": EPP_IMAGE, "imagePullPolicy": "IfNotPresent",
        "args": ["--pool-name", pool, "--pool-group", POOL_GROUP,  # namespace: $NAMESPACE
                 "--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml",
                 "--grpc-port", str(EXT_PROC_PORT), "--grpc-health-port", str(HEALTH_PORT),
                 "--refresh-metrics-interval=50ms", "--metrics-staleness-threshold=2s",
                 "--tracing=false"],
        "env": [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{f}"}}}
                for n, f in (("NAMESPACE", "namespace"), ("POD_NAME", "name"))],
        "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT},
                  {"name": "grpc-health", "containerPort": HEALTH_PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "livenessProbe": {**health, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**health, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [{"name": "plugins-config", "mountPath": "/config"}],
    }
    select = {"app.kubernetes.io/name": epp}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(epp)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(epp),
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(epp),
         "subjects": [{"kind": "ServiceAccount", "name": epp}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(epp),
         "data": {"default-plugins.yaml": epp_config(metrics_path, engine)}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(epp), "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": select},
            "template": {"metadata": {"labels": select}, "spec": {
                "serviceAccountName": epp,
                "terminationGracePeriodSeconds": 130,
                "containers": [container],
                "volumes": [{"name": "plugins-config", "configMap": {"name": epp}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(epp), "spec": {
            "selector": select, "type": "ClusterIP", "ports": [
                {"name": "grpc-ext-proc", "protocol": "TCP", "port": EXT_PROC_PORT,
                 "appProtocol": "kubernetes.io/h2c"},
                {"name": "http-metrics", "protocol": "TCP", "port": METRICS_PORT}]}},
    ]


def pool_of(fleet: FleetConfig) -> tuple[str, str, dict[str, str]]:
    """The example pool: (model, pool name, pod selector). Every pod serving the default
    deployment's model, whichever chip: the picker routes one model across them."""
    model = next(d.model for d in fleet.deployments if d.name == fleet.default_deployment)
    selector = {"app.kubernetes.io/component": "model-server", "llm-d.ai/model": model}
    return model, "doppelchip-" + model.replace(".", "-"), selector


def llm_d_values(fleet: FleetConfig) -> str:
    """Helm values pointing llm-d-router's charts (llm-d-router-gateway or -standalone,
    v0.10.0) at the same pods as the InferencePool: layer after llm-d's own values files."""
    selector = pool_of(fleet)[2]
    doc = {"router": {
        "epp": {"image": {"tag": EPP_IMAGE.rsplit(":", 1)[1], "pullPolicy": "IfNotPresent"}},
        "modelServers": {"type": "vllm", "protocol": "http",
                         "targetPorts": [{"number": fleet.server.metrics_port}],
                         "matchLabels": selector}}}
    return dump("Helm values for llm-d's router charts (oci://ghcr.io/llm-d/charts/"
                "llm-d-router-gateway or llm-d-router-standalone, version v0.10.0): the endpoint "
                "picker's image at that release, and the doppelchip pods of deploy/k8s/pods as "
                "the model servers (vLLM, HTTP on their served port). docs/ROUTERS.md has the "
                "commands.", [(doc, {})])


def pool_doc(pool: str, selector: dict[str, str], port: int, epp: str) -> Doc:
    """An InferencePool of the pods `selector` picks, sent HTTP on `port`, its picker `epp`."""
    return {
        "apiVersion": f"{POOL_GROUP}/v1", "kind": "InferencePool", "metadata": _meta(pool),
        "spec": {
            "selector": {"matchLabels": selector},
            "targetPorts": [{"number": port}],
            "appProtocol": "http",
            "endpointPickerRef": {"name": epp, "port": {"number": EXT_PROC_PORT},
                                  "failureMode": "FailOpen"}},
    }


def gateway_doc(name: str) -> Doc:
    """A Gateway listening for HTTP on port 80 (gatewayClassName istio)."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": _meta(name),
        "spec": {"gatewayClassName": "istio",
                 "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
    }


def route_doc(pool: str, gateway: str) -> Doc:
    """An HTTPRoute, named as the pool, sending every path on `gateway` to it."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": _meta(pool),
        "spec": {
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                            "name": gateway}],
            "rules": [{"backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool",
                                        "name": pool}],
                       "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                       "timeouts": {"request": "300s"}}]},
    }


def inference_gateway(fleet: FleetConfig) -> dict[str, str]:
    """The example's files: a pool over every doppelchip pod serving the default deployment's
    model (pods of different chips serving one model: the EPP routes by their queues and KV
    use), its EPP, a Gateway and the HTTPRoute."""
    model, pool, selector = pool_of(fleet)
    epp = f"{pool}-epp"
    members = sorted(d.name for d in fleet.deployments if d.model == model)
    return {
        "inferencepool.yaml": dump(
            f"An InferencePool of the pods serving {model!r} (pods/: {', '.join(members)}), "
            "routed by the endpoint picker in epp.yaml on its queue, KV-usage and prefix-cache "
            "scorers. Pool only one deployment's replicas instead: select on its `app` label "
            "and scale it (README.md).",
            [(pool_doc(pool, selector, fleet.server.metrics_port, epp), {})]),
        "epp.yaml": dump(
            f"The endpoint picker of {pool} (llm-d-router v0.10.0, as its gateway chart renders "
            "it): watches the pool's pods, scrapes each one's /metrics every 50 ms and picks a "
            f"pod for each request over Envoy ext_proc on {EXT_PROC_PORT}.",
            [(doc, {}) for doc in epp_objects(pool, epp)]),
        "gateway.yaml": dump(
            "A Gateway for the HTTPRoute (listener HTTP :80). gatewayClassName is your "
            "implementation's (istio here; agentgateway, kgateway, nginx, gke-l7-rilb, ...). "
            "Skip this file when a Gateway exists and point the route at it. Istio also needs "
            "a DestinationRule for the picker's TLS (README.md).",
            [(gateway_doc(GATEWAY), {})]),
        "httproute.yaml": dump(
            f"Every path on the Gateway {GATEWAY!r} to the pool {pool!r} (the endpoint picker "
            "chooses the pod).", [(route_doc(pool, GATEWAY), {})]),
    }
