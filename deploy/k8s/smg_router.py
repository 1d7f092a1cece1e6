"""The smg example (smg/): SGLang-shaped doppelchip pods behind the smg router in gRPC mode.

Why it exists: with real SGLang, platform teams run workers started as `sglang serve
--smg-grpc-mode` and put smg in front, discovering them by label (smg's Helm chart, its
`--service-discovery`). The image's `sglang` command is doppelchip's, so the same shape runs
on a cluster with no GPU. The worker's ports, its doppelchip deployment and its start-up
window come from doppelchip's own translation of that command line (doppelchip/cmd_sglang.py),
and its probes, drain and resources from generate.py's `pod` (the pods/ files' numbers), so
neither can drift from what `sglang serve` does here.

Followed in smg (source: github.com/lightseekorg/smg at main 73da68ca, whose version is 1.9.0;
the image and the tests pin 1.13.0, whose binary, run once here with no workers, answered
/liveness 200 and /readiness 503):
- discovery (model_gateway/src/service_discovery.rs): each selected pod that is Ready and
  Running becomes a worker at its bare `IP:--service-discovery-port`, which smg probes over
  HTTP and gRPC (workflow/steps/local/detect_connection.rs); a terminating pod's worker is
  removed at once. It lists and watches pods,
  hence a Role with get/list/watch on pods (as its Helm chart's templates/role.yaml).
- probes (model_gateway/src/server.rs, health.rs): `/liveness` 200 while the process serves;
  `/readiness` 503 until a healthy worker (and, in gRPC mode, its tokenizer) is registered,
  and while draining.
- the router image: published as lightseekorg/smg:VERSION (.github/workflows/release-docker.yml;
  1.13.0's tag not checked against the registry), entrypoint `python3 -m smg.launch_router`
  (docker/Dockerfile), which takes no `launch` subcommand: hence `command: [smg]`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from emit import Comments, Doc, dump

from server.config import FleetConfig
from server.engine.options import EngineOptions
from server.server_config import ServerConfig

WORKER = "doppelchip-sglang-grpc"
WORKER_ARGV = ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--smg-grpc-mode",
               "--host", "0.0.0.0", "--port", "30000", "--enable-metrics"]
SMG = "smg"
SMG_IMAGE = "docker.io/lightseekorg/smg:1.13.0"  # pyproject.toml's dev pin; tag not checked
SMG_PORT, SMG_METRICS_PORT = 30000, 29000
NAME, COMPONENT = "app.kubernetes.io/name", "app.kubernetes.io/component"


class PodBuilder(Protocol):
    """generate.py's `pod`: a doppelchip Deployment with the pods/ files' probes, drain and
    resources."""

    def __call__(self, name: str, labels: dict[str, str], args: list[str], build_s: float,
                 ranks: int, cpu: int, server: ServerConfig) -> Doc: ...


@contextmanager
def image_environment() -> Iterator[None]:
    """The environment `sglang serve` (and trtllm_serve.py's `trtllm-serve`) parses its defaults
    from in the container: the image sets no DOPPELCHIP_CHIP, _TIME_SCALE or _COLD, so the
    generating machine's must not count."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("DOPPELCHIP_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def translation(argv: list[str], fleet: FleetConfig) -> tuple[list[str], EngineOptions,
                                                              ServerConfig]:
    """(`doppelchip serve` arguments, the pod's deployment, its server) for `sglang serve
    ARGV`, as the container's `sglang serve` computes them."""
    from doppelchip.cli import build_parser
    from doppelchip.cmd_serve import pod_fleet
    from doppelchip.cmd_sglang import translate
    from doppelchip.sglang_argv import sglang_argv

    with image_environment():
        out, _ = translate(build_parser("sglang").parse_args(
            sglang_argv(["sglang", "serve", *argv])))
        pod = pod_fleet(build_parser("serve").parse_args(["serve", *out]), fleet)

    def value(flag: str) -> int:
        return int(out[out.index(flag) + 1])

    server = dataclasses.replace(pod.server, port=value("--port"),
                                 http_port=value("--http-port"))
    return out, pod.deployments[0], server


def _grpc(probe: Doc, port: int, service: str) -> Doc:
    """The pods/ file's HTTP probe as kubelet's native gRPC health probe of `service`."""
    return {"grpc": {"port": port, "service": service},
            **{k: v for k, v in probe.items() if k != "httpGet"}}


def worker(out: list[str], d: EngineOptions, server: ServerConfig, pod: PodBuilder,
           build_s: float) -> tuple[Doc, Comments]:
    """The worker Deployment: generate.py's pod for the translated deployment, running
    `sglang serve WORKER_ARGV`, its probes asking gRPC health."""
    from server.sglang_servicer import SERVICE_NAME

    labels = {"app": WORKER, NAME: "doppelchip", "app.kubernetes.io/instance": d.name,
              COMPONENT: "model-server"}
    doc = pod(WORKER, labels, [], build_s, d.local_ranks, d.local_ranks, server)
    doc["spec"]["replicas"] = 2
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    c.update(command=["sglang", "serve"], args=list(WORKER_ARGV))
    c["ports"] = sorted(c["ports"], key=lambda p: p["containerPort"])  # grpc, then http
    start, ready, live = (c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe"))
    c.update(startupProbe=_grpc(start, server.port, SERVICE_NAME),
             readinessProbe=_grpc(ready, server.port, SERVICE_NAME),
             livenessProbe=_grpc(live, server.port, ""))
    window = start["failureThreshold"] * start["periodSeconds"]
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = math.ceil(server.drain_grace_s)
    grace = doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    notes = {
        "args": (
            f"The image's `sglang serve` (doppelchip's): with --smg-grpc-mode, SGLang's "
            f"scheduler service ({SERVICE_NAME}) and gRPC health on --port ({server.port}), "
            f"SGLang's HTTP API (/health, /metrics, /v1/loads, /generate) on --port + 1 "
            f"({server.metrics_port}); /metrics only with --enable-metrics, as in SGLang. It "
            f"runs `doppelchip serve {' '.join(out)}`."),
        "startupProbe": (
            f"Start-up: gRPC health answers {SERVICE_NAME} SERVING once the deployment is "
            f"ready. {window} s: the pods/ files' allowance for the process to start "
            "(`doppelchip serve` took 1.7 s there; `sglang serve` translates its flags and "
            "runs the same server, not timed separately) plus this deployment's engine build "
            f"({build_s:g} s: it starts prebuilt; with --cold the generator adds the "
            "catalogue's build x time_scale). Liveness and readiness wait for this probe."),
        "readinessProbe": (
            f"Readiness: {SERVICE_NAME} is SERVING only while the deployment is ready (not "
            "while a cold engine builds, a crashed one restarts, or the pod drains); smg adds "
            "a worker only for a Ready pod and drops a terminating pod's at once (its "
            "service_discovery.rs). Period, timeout and misses are the pods/ files' "
            f"({ready['timeoutSeconds']} s timeout, {ready['failureThreshold']} misses x "
            f"{ready['periodSeconds']} s), sized there from /health's slowest answer under "
            "256 streams (docs/ROUTERS.md, \"Probe numbers\"); the same process answers gRPC "
            "health, whose latency under load was not measured."),
        "livenessProbe": (
            "Liveness: gRPC health of the server as a whole (service \"\": SERVING from start "
            "until the drain), so a cold build or an engine restart never restarts the "
            f"container. {live['failureThreshold']} misses x {live['periodSeconds']} s = "
            f"{live['failureThreshold'] * live['periodSeconds']} s, as in the pods/ files: "
            "longer than the supervisor's restart of a crashed engine and than a drain "
            f"({pre_stop} s + {drain} s); no CPU limit (CFS throttling would stall the event "
            "loop that answers the probes)."),
        "terminationGracePeriodSeconds": (
            f"> preStop sleep ({pre_stop} s) + drain_grace_s ({drain} s) + "
            f"{grace - pre_stop - drain} s for the processes to exit, as in the pods/ files: "
            "SIGTERM drains (gRPC health NOT_SERVING, /health 503, in-flight streams finish) "
            "and the pod is never killed mid-drain."),
    }
    return doc, notes


def _meta(labels: dict[str, str]) -> Doc:
    return {"name": SMG, "labels": labels}


def router(worker_doc: Doc) -> list[tuple[Doc, Comments]]:
    """smg's ServiceAccount, Role, RoleBinding, Deployment and Service, discovering the pods
    of `worker_doc` on their gRPC port."""
    template = worker_doc["spec"]["template"]
    (wc,) = template["spec"]["containers"]
    grpc_port = next(p["containerPort"] for p in wc["ports"] if p["name"] == "grpc")
    select = [f"{k}={v}" for k, v in worker_doc["spec"]["selector"]["matchLabels"].items()]
    labels = {NAME: SMG, COMPONENT: "router"}
    args = ["launch", "--host", "0.0.0.0", "--port", str(SMG_PORT), "--service-discovery",
            "--selector", *select,
            "--service-discovery-port", str(grpc_port),
            "--service-discovery-namespace", "$(POD_NAMESPACE)", "--policy", "cache_aware",
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(SMG_METRICS_PORT)]
    ready, live = wc["readinessProbe"], wc["livenessProbe"]

    def probe(path: str, numbers: Doc) -> Doc:  # the workers' numbers, on smg's own path
        return {"httpGet": {"path": path, "port": "http"},
                **{k: v for k, v in numbers.items() if k != "grpc"}}

    container = {
        "name": SMG, "image": SMG_IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": ["smg"], "args": args,
        "env": [{"name": "POD_NAMESPACE",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "http", "containerPort": SMG_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": SMG_METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": probe("/readiness", ready),
        "livenessProbe": probe("/liveness", live),
        "lifecycle": copy.deepcopy(wc["lifecycle"]),
        "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
    }
    grace = template["spec"]["terminationGracePeriodSeconds"]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(labels),
        "spec": {"replicas": 1, "selector": {"matchLabels": {NAME: SMG}}, "template": {
            "metadata": {"labels": labels, "annotations": {
                "prometheus.io/scrape": "true", "prometheus.io/port": str(SMG_METRICS_PORT),
                "prometheus.io/path": "/metrics"}},
            "spec": {"serviceAccountName": SMG, "terminationGracePeriodSeconds": grace,
                     "containers": [container]}}},
    }
    notes = {
        "command": (
            "The image's entrypoint may not be the `smg` command (smg's docker/Dockerfile at "
            "version 1.9.0: `python3 -m smg.launch_router`, which takes no `launch`), so it is "
            "named here."),
        "args": (
            f"Kubernetes discovery in this namespace ($(POD_NAMESPACE) is expanded by "
            f"Kubernetes): every Ready pod labelled {' '.join(select)} "
            f"becomes a worker at its bare IP:{grpc_port}, which smg probes and finds to be "
            "SGLang's gRPC scheduler service; cache_aware routes a prompt to the worker that "
            f"holds its prefix. OpenAI HTTP on {SMG_PORT}, Prometheus on {SMG_METRICS_PORT}."),
        "readinessProbe": (
            "Readiness: smg's /readiness is 503 until a worker is healthy and its tokenizer "
            "(GetTokenizer) is loaded, and while smg drains; it reads an in-memory snapshot "
            "(smg's health.rs). The numbers are the workers' (the pods/ files'), not measured "
            "for smg."),
        "livenessProbe": (
            "Liveness: /liveness is 200 while the process serves (a drain too), whatever the "
            "workers do; the workers' numbers, not measured for smg."),
        "lifecycle": (
            "As the workers: keep serving while the Service drops the terminating pod, then "
            "SIGTERM."),
        "resources": (
            "One core, as a worker. smg 1.13.0 held 48 MiB resident idle with no workers "
            "(measured once on the development machine); 256 MiB leaves room for the "
            "tokenizer and the cache_aware trees it builds under load, which was not measured: "
            "hence no memory limit. No CPU limit, as for the workers."),
        "terminationGracePeriodSeconds": (
            f"{grace} s, as the workers: on SIGTERM smg's /readiness turns 503 and it waits "
            "for in-flight requests up to --shutdown-grace-period-secs (180 s by default), so "
            f"a stream still open {grace} s after the pod's deletion is cut. Raise both for "
            "longer streams."),
    }
    rbac = "rbac.authorization.k8s.io"
    return [
        ({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(labels)}, {}),
        ({"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": _meta(labels),
          "rules": [{"apiGroups": [""], "resources": ["pods"],
                     "verbs": ["get", "list", "watch"]}]}, {}),
        ({"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": _meta(labels),
          "subjects": [{"kind": "ServiceAccount", "name": SMG}],
          "roleRef": {"apiGroup": rbac, "kind": "Role", "name": SMG}}, {}),
        (deployment, notes),
        ({"apiVersion": "v1", "kind": "Service", "metadata": _meta(labels), "spec": {
            "type": "ClusterIP", "selector": {NAME: SMG}, "ports": [
                {"name": "http", "port": SMG_PORT, "targetPort": "http", "protocol": "TCP",
                 "appProtocol": "http"},
                {"name": "metrics", "port": SMG_METRICS_PORT, "targetPort": "metrics",
                 "protocol": "TCP", "appProtocol": "http"}]}}, {}),
    ]


def smg_example(fleet: FleetConfig, pod: PodBuilder,
                build_seconds: Callable[[EngineOptions, ServerConfig], float]) -> dict[str, str]:
    """The example's files by name (without the kustomization)."""
    out, d, server = translation(WORKER_ARGV, fleet)
    worker_doc, worker_notes = worker(out, d, server, pod, build_seconds(d, server))
    return {
        f"{WORKER}.yaml": dump(
            f"SGLang-shaped doppelchip pods for smg in gRPC mode: each runs `sglang serve "
            f"{' '.join(WORKER_ARGV)}` (doppelchip's `sglang serve`, the image's `sglang`): "
            f"SGLang's scheduler service and gRPC health on {server.port}, SGLang's HTTP API on "
            f"{server.metrics_port}. smg ({SMG}.yaml) finds them by their `app` label; no "
            "Service: smg routes to each pod, not to a Service's one connection.",
            [(worker_doc, worker_notes)]),
        f"{SMG}.yaml": dump(
            f"The smg router ({SMG_IMAGE}: the version pyproject.toml pins for the tests; the "
            f"tag was not checked against the registry) over the pods of {WORKER}.yaml in "
            "gRPC mode: Kubernetes service discovery (a Role to read pods in this namespace), "
            f"cache_aware routing, OpenAI HTTP on {SMG_PORT} and Prometheus metrics on "
            f"{SMG_METRICS_PORT} (Service {SMG}).", router(worker_doc)),
    }
