"""Generate the Kubernetes manifests from the fleet (the YAML beside this file is its output).

    .venv/bin/python deploy/k8s/generate.py           # rewrite the generated directories
    .venv/bin/python deploy/k8s/generate.py --check   # exit 1 if the committed YAML is stale
    .venv/bin/python deploy/k8s/generate.py --out DIR # write (or --check) another directory

The input is the built-in fleet (server/default_fleet.toml, read by server.config.load_fleet)
and the server's defaults (ports, drain grace, time scale), so the manifests cannot drift from
them (tests/deploy runs --check). What it writes, and README.md beside it says how to apply:
- pods/: one Deployment + Service per deployment of the fleet, each a vLLM-shaped pod running
  `doppelchip serve --deployment NAME` (HTTP probes on /health, vLLM-style labels, scrape
  annotations, a drain that fits the grace period);
- fleet/: the whole fleet in one pod (dashboards and demos; never behind a router);
- monitoring/: a Prometheus Operator ServiceMonitor for every doppelchip Service;
- inference-gateway/: an InferencePool, its endpoint picker and an HTTPRoute (gaie.py);
- llm-d/: Helm values pointing llm-d's router charts at the same pods (gaie.py);
- smg/: SGLang-shaped pods (`sglang serve --smg-grpc-mode`) behind the smg router
  (smg_router.py; not smg.py, which would shadow the installed smg package);
- trtllm-serve/: TensorRT-LLM-shaped pods (`trtllm-serve MODEL --config ...`) behind their own
  InferencePool and endpoint picker, read as engine type trtllm-serve (trtllm_serve.py).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]  # the repository's packages and the sibling modules

from emit import Comments, Doc, dump  # noqa: E402
from gaie import inference_gateway, llm_d_values  # noqa: E402
from smg_router import smg_example  # noqa: E402
from trtllm_serve import example as trtllm_serve_example  # noqa: E402

from devices import make_compile_strategy, place  # noqa: E402
from server.config import FleetConfig, load_fleet  # noqa: E402
from server.engine.options import EngineOptions  # noqa: E402
from server.server_config import ServerConfig  # noqa: E402

IMAGE = "doppelchip:latest"  # built by deploy/Dockerfile; load it into the cluster (README.md)
GENERATED = ("pods", "fleet", "monitoring", "inference-gateway", "smg", "trtllm-serve", "llm-d")
NAME = "app.kubernetes.io/name"
COMPONENT = "app.kubernetes.io/component"

# Probes. /health measured under load (docs/ROUTERS.md, "Probe numbers"): one pod, 256 HTTP
# streams on the 2-core development machine, a new connection per probe as kubelet opens:
# p50 4 ms, p99 236-321 ms, slowest of ~470 probes 430 ms.
READINESS = {"periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2, "successThreshold": 1}
LIVENESS = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6}
STARTUP_PERIOD_S, STARTUP_TIMEOUT_S = 2, 2
PROCESS_START_S = 60  # container start to a listening /health: 1.7 s measured here; 35x slack
PRESTOP_SLEEP_S = 5  # keep serving while the gateways drop the terminating pod
EXIT_MARGIN_S = 15  # after the drain: front ends and engine processes stop (< 1 s measured)

MEASURED_MAX_MS = 430  # the slowest /health answer under 256 streams (above)


def probe_notes(server: ServerConfig) -> Comments:
    """Why each number is what it is, written beside it in every pod file."""
    r, li, drain = READINESS, LIVENESS, server.drain_grace_s
    return {
        "startupProbe": (
            f"Start-up: the process starts (1.7 s measured; {PROCESS_START_S} s allowed) and a "
            "`cold` deployment builds its engine (emulated seconds x time_scale, from the "
            "catalogue); /health is 503 until then. Liveness and readiness wait for this "
            "probe, so a long build never counts against them; a generous window costs "
            "nothing when the pod starts fast."),
        "readinessProbe": (
            f"Readiness: whether routers send work. /health answered in <= {MEASURED_MAX_MS} ms "
            f"under 256 streams on 2 cores, so the {r['timeoutSeconds']} s timeout is "
            f"~{round(r['timeoutSeconds'] * 1000 / MEASURED_MAX_MS)}x the slowest answer seen; "
            f"{r['failureThreshold']} misses in a row "
            f"({r['failureThreshold'] * r['periodSeconds']} s) take the pod out, so one slow "
            "answer does not eject a busy pod (its load would move to the others and it "
            "would flap). A drain takes the pod out at once anyway: a terminating pod is "
            "never Ready to the endpoint picker."),
        "livenessProbe": (
            "Liveness: restart only what the pod's own supervisor could not fix: "
            f"{li['failureThreshold']} misses x {li['periodSeconds']} s = "
            f"{li['failureThreshold'] * li['periodSeconds']} s of failures, longer than the "
            "supervisor's restart of a crashed engine (2 s back-off, doubling) and than a "
            f"drain ({PRESTOP_SLEEP_S} s + {drain:g} s); the {li['timeoutSeconds']} s timeout "
            f"is ~{round(li['timeoutSeconds'] * 1000 / MEASURED_MAX_MS)}x the slowest /health "
            "answer measured under load. No CPU limit (below): CFS throttling would stall the "
            "event loop that answers the probes."),
        "terminationGracePeriodSeconds": (
            f"> preStop sleep ({PRESTOP_SLEEP_S} s) + drain_grace_s ({drain:g} s) + "
            f"{EXIT_MARGIN_S} s for the processes to exit: SIGTERM drains (/health 503, gRPC "
            "health NOT_SERVING, in-flight streams finish) and the pod is never killed "
            "mid-drain."),
    }


def k8s_name(prefix: str, name: str) -> str:
    """`prefix-name` if it is a valid DNS-1035 label (a Service name), else a clear error."""
    full = f"{prefix}-{name}"
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", full) or len(full) > 63:
        raise SystemExit(f"deployment {name!r}: {full!r} is not a valid Kubernetes name "
                         "(lower-case letters, digits and '-', at most 63 characters)")
    return full


def startup_seconds(d: EngineOptions, server: ServerConfig) -> float:
    """Wall seconds the deployment spends building its engine before /health answers 200."""
    compiler = make_compile_strategy(place(d.spec()))
    return compiler.startup_seconds(d.start == "cold") * server.time_scale


def probes(build_s: float) -> Doc:
    health = {"path": "/health", "port": "http"}
    window = PROCESS_START_S + build_s
    return {
        "startupProbe": {"httpGet": health, "periodSeconds": STARTUP_PERIOD_S,
                         "timeoutSeconds": STARTUP_TIMEOUT_S,
                         "failureThreshold": math.ceil(window / STARTUP_PERIOD_S)},
        "readinessProbe": {"httpGet": health, **READINESS},
        "livenessProbe": {"httpGet": health, **LIVENESS},
    }


def pod(name: str, labels: dict[str, str], args: list[str], build_s: float, ranks: int,
        cpu: int, server: ServerConfig) -> Doc:
    """A Deployment of one doppelchip container requesting `cpu` cores, its memory sized by
    its `ranks` engine cores (measured, every process counted: one deployment 290 MiB idle and
    368 MiB under 256 HTTP streams; the eight-deployment fleet 750 MiB idle, i.e. ~215 MiB
    for the supervisor and front end plus ~70 MiB per engine)."""
    container = {
        "name": "doppelchip", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": ["doppelchip", "serve"],
        "args": [*args, "--host", "0.0.0.0", "--port", str(server.port),
                 "--http-port", str(server.metrics_port)],
        "ports": [{"name": "http", "containerPort": server.metrics_port, "protocol": "TCP"},
                  {"name": "grpc", "containerPort": server.port, "protocol": "TCP"}],
        **probes(build_s),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
        "resources": {"requests": {"cpu": str(cpu), "memory": f"{384 + 128 * ranks}Mi"},
                      "limits": {"memory": f"{1536 + 512 * ranks}Mi"}},
    }
    grace = PRESTOP_SLEEP_S + math.ceil(server.drain_grace_s) + EXIT_MARGIN_S
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(server.metrics_port),
                    "prometheus.io/path": "/metrics"}},
                "spec": {"terminationGracePeriodSeconds": grace, "containers": [container]},
            },
        },
    }


def service(name: str, labels: dict[str, str], server: ServerConfig) -> Doc:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": {"app": name}, "ports": [
            {"name": "http", "port": server.metrics_port, "targetPort": "http",
             "protocol": "TCP", "appProtocol": "http"},
            {"name": "grpc", "port": server.port, "targetPort": "grpc", "protocol": "TCP",
             "appProtocol": "kubernetes.io/h2c"}]},
    }


def pod_labels(name: str, d: EngineOptions) -> dict[str, str]:
    return {
        "app": name,  # the inference gateway's vLLM examples: app: <model-server Deployment>
        NAME: "doppelchip", "app.kubernetes.io/instance": d.name, COMPONENT: "model-server",
        "llm-d.ai/engine-type": "vllm",  # the endpoint picker reads vLLM's metric names
        "llm-d.ai/model": d.model,  # the served model (llm-d's label); the pool selects on it
    }


def pod_file(d: EngineOptions, server: ServerConfig) -> str:
    name = k8s_name("doppelchip", d.name)
    labels = pod_labels(name, d)
    svc_labels = {k: labels[k] for k in (NAME, "app.kubernetes.io/instance", COMPONENT)}
    header = (f"doppelchip pod for the deployment {d.name!r} ({d.model} {d.quant} on {d.chip} "
              f"with {d.engine}), as a vLLM pod: OpenAI HTTP, /health and /metrics on "
              f"{server.metrics_port}, gRPC on {server.port}.")
    build_s = startup_seconds(d, server)
    return dump(header, [
        (pod(name, labels, ["--deployment", d.name], build_s, d.local_ranks,
             d.local_ranks, server),  # a core per engine: it steps without pause
         probe_notes(server)),
        (service(name, svc_labels, server), {})])


def fleet_file(fleet: FleetConfig) -> str:
    server, name = fleet.server, "doppelchip-fleet"
    labels = {"app": name, NAME: "doppelchip", COMPONENT: "fleet"}
    build_s = max(startup_seconds(d, server) for d in fleet.deployments)
    ranks = sum(d.local_ranks for d in fleet.deployments)
    header = ("doppelchip's whole default fleet in one pod (every deployment on one port pair): "
              "for dashboards, demos and doppelchip.v1 clients that name a deployment. Never "
              "put it behind a router (routers assume one model server per pod; see README.md).")
    # one core: a demo pod whose engines mostly idle (no CPU limit: it bursts when loaded)
    return dump(header, [(pod(name, labels, [], build_s, ranks, 1, server), probe_notes(server)),
                         (service(name, {NAME: "doppelchip", COMPONENT: "fleet"}, server), {})])


def service_monitor() -> str:
    doc = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": "doppelchip", "labels": {NAME: "doppelchip"}},
        "spec": {"selector": {"matchLabels": {NAME: "doppelchip"}},
                 "endpoints": [{
                     "port": "http", "path": "/metrics", "interval": "5s",
                     # a pod's series carry no `deployment` label (as a vLLM pod's); the
                     # target's (the Service's instance label) lets doppelchip's dashboards
                     # tell pods apart; honorLabels keeps the fleet pod's own labels
                     "honorLabels": True,
                     "relabelings": [{"sourceLabels": [
                         "__meta_kubernetes_service_label_app_kubernetes_io_instance"],
                         "targetLabel": "deployment"}]}]},
    }
    header = ("Scrapes every doppelchip Service (pods/ and fleet/) on its HTTP port, for clusters "
              "running the Prometheus Operator; elsewhere the pods' prometheus.io/* annotations "
              "serve Prometheus' kubernetes_sd pod role. Pod series get a `deployment` label "
              "from the Service's app.kubernetes.io/instance.")
    return dump(header, [(doc, {})])


def kustomization(resources: list[str]) -> str:
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "resources": resources}
    return dump("A kustomization of this directory.", [(doc, {})])


def render(fleet: FleetConfig) -> dict[str, str]:
    """Every generated file, by path relative to deploy/k8s."""
    files = {f"pods/{d.name}.yaml": pod_file(d, fleet.server) for d in fleet.deployments}
    files["pods/kustomization.yaml"] = kustomization(sorted(
        Path(p).name for p in files if p.startswith("pods/")))
    files["fleet/fleet.yaml"] = fleet_file(fleet)
    files["fleet/kustomization.yaml"] = kustomization(["fleet.yaml"])
    files["monitoring/servicemonitor.yaml"] = service_monitor()
    files["monitoring/kustomization.yaml"] = kustomization(["servicemonitor.yaml"])
    gateway = inference_gateway(fleet)
    files.update({f"inference-gateway/{n}": text for n, text in gateway.items()})
    files["inference-gateway/kustomization.yaml"] = kustomization(sorted(gateway))
    files["llm-d/values.yaml"] = llm_d_values(fleet)
    example = smg_example(fleet, pod, startup_seconds)
    files.update({f"smg/{n}": text for n, text in example.items()})
    files["smg/kustomization.yaml"] = kustomization(sorted(example))
    trtllm = trtllm_serve_example(fleet, pod, service, startup_seconds, probe_notes)
    files.update({f"trtllm-serve/{n}": text for n, text in trtllm.items()})
    files["trtllm-serve/kustomization.yaml"] = kustomization(sorted(trtllm))
    return files


def stale(files: dict[str, str], out: Path) -> list[str]:
    """Generated paths whose file differs, is missing, or should not be there."""
    wrong = [p for p, text in files.items()
             if not (out / p).is_file() or (out / p).read_text() != text]
    extra = [str(f.relative_to(out)) for d in GENERATED if (out / d).is_dir()
             for f in (out / d).iterdir() if str(f.relative_to(out)) not in files]
    return sorted(wrong + extra)


def main(argv: list[str]) -> int:
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else HERE
    files = render(load_fleet())
    if "--check" in argv:
        bad = stale(files, out)
        if bad:
            print(f"stale: {', '.join(bad)}; run .venv/bin/python deploy/k8s/generate.py")
        return 1 if bad else 0
    for d in GENERATED:  # a deployment removed from the fleet loses its file
        for f in (out / d).glob("*.yaml") if (out / d).is_dir() else ():
            if str(f.relative_to(out)) not in files:
                f.unlink()
    for path, text in files.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
