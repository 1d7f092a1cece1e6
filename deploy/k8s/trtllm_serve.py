"""The trtllm-serve example (trtllm-serve/): TensorRT-LLM-shaped doppelchip pods, started with
TensorRT-LLM's own command line, behind the inference gateway's endpoint picker reading them as
engine type `trtllm-serve`.

Why it exists: llm-d runs TensorRT-LLM as `trtllm-serve MODEL --host 0.0.0.0 --port 8000` with a
`--extra_llm_api_options`/`--config` YAML from a ConfigMap, labels the pods
`llm-d.ai/engine-type: trtllm-serve` and points the picker's metrics data source at
`/prometheus/metrics` (trtllm-serve's `/metrics` is iteration-stats JSON). The image's
`trtllm-serve` is doppelchip's (deploy/Dockerfile), so the same shape runs with no GPU. The pod's
ports and deployment come from doppelchip's own translation of that command line and YAML
(doppelchip/cmd_trtllm.py), its probes, drain and resources from generate.py's `pod` (the pods/
files' numbers), and the picker from gaie.py (the inference-gateway example's release, v0.10.0),
so none can drift.

Followed (llm-d/llm-d at the search index's versions, as docs/ROUTERS.md records the others):
- `guides/optimized-baseline/modelserver/gpu/trtllm/base/patch-trtllm.yaml` @2267387c: the
  container `trtllm-serve serve MODEL --host=0.0.0.0 --port=8000 ... --extra_llm_api_options=
  /etc/trtllm/llm_api_options.yaml`, the YAML a ConfigMap mounted at /etc/trtllm; /health probes.
  Its ConfigMap file was not in the index: its keys are the two the patch's comment and
  `docs/architecture/model-servers/README.md` @a7922edc name (return_perf_metrics mounts
  /prometheus/metrics, enable_iter_perf_stats starts the loop that fills the gauges; TensorRT-LLM
  v1.3.0rc12 or newer). Nothing else is set: every other key is TensorRT-LLM's default.
- `guides/optimized-baseline/modelserver/gpu/trtllm/base/kustomization.yaml` @c7b92a65: the
  model label is the repository's last part (`llm-d.ai/model: Qwen3-32B` for Qwen/Qwen3-32B).
- `guides/optimized-baseline/router/optimized-baseline-trtllm.values.yaml` @2ad7f919: the picker's
  `metricsDataSource.path: /prometheus/metrics` and `modelServers.type: trtllm-serve` (the
  core-metrics-extractor's defaultEngine).
- llm-d/llm-d-router v0.10.0 (commit 71f4f099, the picker's image here):
  pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go's built-in `trtllm-serve`
  engine, the names spelled out below (the same at 08cbacc, tests/observability's reference).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml
from emit import Comments, Doc, dump
from gaie import EPP_IMAGE, epp_objects, gateway_doc, pool_doc, route_doc
from smg_router import PodBuilder, image_environment

from server.config import FleetConfig
from server.engine.options import EngineOptions
from server.server_config import ServerConfig

MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the HF name doppelchip resolves to llama-3.1-8b
CONFIG_DIR = "/etc/trtllm"
CONFIG_PATH = f"{CONFIG_DIR}/config.yaml"
ARGV = [MODEL, "--host", "0.0.0.0", "--port", "8000", "--config", CONFIG_PATH]
# TensorRT-LLM's LlmArgs: /prometheus/metrics and the iteration stats behind its gauges
CONFIG = {"return_perf_metrics": True, "enable_iter_perf_stats": True}
METRICS_PATH = "/prometheus/metrics"
APP = "doppelchip-trtllm-serve"  # the Deployment, its Service and `app` label
CONFIG_MAP = f"{APP}-config"
GATEWAY = "trtllm-serve-gateway"  # inference-gateway/'s is `inference-gateway`: both can run
NAME, COMPONENT = "app.kubernetes.io/name", "app.kubernetes.io/component"
ENGINE_TYPE, MODEL_LABEL = "llm-d.ai/engine-type", "llm-d.ai/model"

# What the endpoint picker reads from each trtllm-serve pod (llm-d-router v0.10.0's built-in
# `trtllm-serve` engine, spelled out as gaie.py spells out `vllm`'s)
TRTLLM_ENGINE = {
    "name": "trtllm-serve",
    "queuedRequestsSpec": "trtllm_num_requests_waiting",
    "runningRequestsSpec": "trtllm_num_requests_running",
    "kvUsageSpec": "trtllm_kv_cache_utilization",
    "cacheBlockSizeSpec": "trtllm_kv_cache_tokens_per_block",  # gauges, not an info's labels
    "cacheNumBlocksSpec": "trtllm_kv_cache_max_blocks",
}


def config_text() -> str:
    """The `--config` YAML trtllm-serve reads (the ConfigMap's config.yaml)."""
    return yaml.safe_dump(CONFIG, sort_keys=False, default_flow_style=False)


def translation(fleet: FleetConfig) -> tuple[list[str], list[str], EngineOptions, ServerConfig]:
    """(`doppelchip serve` arguments, start-up warnings, the pod's deployment, its server) for
    `trtllm-serve ARGV` with config_text() at CONFIG_PATH, as the container computes them."""
    from doppelchip.cli import build_parser
    from doppelchip.cmd_serve import pod_fleet
    from doppelchip.cmd_trtllm import translate

    with image_environment(), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(config_text())
        argv = [str(path) if a == CONFIG_PATH else a for a in ARGV]
        out, warnings = translate(build_parser("trtllm-serve").parse_args(["trtllm-serve", *argv]))
        pod = pod_fleet(build_parser("serve").parse_args(["serve", *out]), fleet)
    warnings = [w.replace(str(path), CONFIG_PATH) for w in warnings]

    def value(flag: str) -> int:
        return int(out[out.index(flag) + 1])

    server = dataclasses.replace(pod.server, port=value("--port"),
                                 http_port=value("--http-port"))
    return out, warnings, pod.deployments[0], server


def model_server(out: list[str], warnings: list[str], d: EngineOptions, server: ServerConfig,
                 pod: PodBuilder, notes: Comments, build_s: float) -> tuple[Doc, Comments]:
    """The Deployment: generate.py's pod for the translated deployment, running `trtllm-serve
    ARGV` with the ConfigMap's YAML at CONFIG_PATH, scraped on /prometheus/metrics."""
    labels = {"app": APP, NAME: "doppelchip", "app.kubernetes.io/instance": d.name,
              COMPONENT: "model-server", ENGINE_TYPE: "trtllm-serve",
              MODEL_LABEL: MODEL.rsplit("/", 1)[1]}  # llm-d's: a label value has no '/'
    doc = pod(APP, labels, [], build_s, d.local_ranks, d.local_ranks, server)
    doc["spec"]["replicas"] = 2
    template = doc["spec"]["template"]
    template["metadata"]["annotations"]["prometheus.io/path"] = METRICS_PATH
    (c,) = template["spec"]["containers"]
    c.update(command=["trtllm-serve"], args=list(ARGV))
    c["volumeMounts"] = [{"name": "trtllm-config", "mountPath": CONFIG_DIR, "readOnly": True}]
    template["spec"]["volumes"] = [{"name": "trtllm-config", "configMap": {"name": CONFIG_MAP}}]
    said = "; ".join(warnings) if warnings else "nothing"
    return doc, {
        **notes,
        "annotations": (
            f"Prometheus' kubernetes_sd pod role scrapes {METRICS_PATH}, TensorRT-LLM's trtllm_ "
            "series: trtllm-serve's /metrics is its iteration-stats JSON, not Prometheus text."),
        "args": (
            "The image's `trtllm-serve` (doppelchip's): without --grpc, trtllm-serve's OpenAI "
            f"HTTP server on --port ({server.http_port}: /health, /v1/models, completions, chat, "
            f"/metrics as iteration-stats JSON and, with the YAML's metrics keys, {METRICS_PATH}"
            f"), doppelchip's gRPC (doppelchip.v1.Inference, trtllm.TrtllmService) on "
            f"{server.port}, the --grpc-port default. It runs `doppelchip serve {' '.join(out)}` "
            f"and warns at start-up: {said}."),
        "readinessProbe": notes["readinessProbe"] + (
            " (Measured on the pods/ files' vLLM-shaped /health; trtllm-serve's /health is "
            "answered by the same process, not timed separately.)"),
        "volumeMounts": f"The ConfigMap {CONFIG_MAP}: {CONFIG_PATH} is trtllm-serve's --config.",
    }


def example(fleet: FleetConfig, pod: PodBuilder,
            service: Callable[[str, dict[str, str], ServerConfig], Doc],
            build_seconds: Callable[[EngineOptions, ServerConfig], float],
            probe_notes: Callable[[ServerConfig], Comments]) -> dict[str, str]:
    """The example's files by name (without the kustomization); `pod`, `service`,
    `build_seconds` and `probe_notes` are generate.py's."""
    out, warnings, d, server = translation(fleet)
    deployment, notes = model_server(out, warnings, d, server, pod, probe_notes(server),
                                     build_seconds(d, server))
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": CONFIG_MAP, "labels": {"app": APP}},
                  "data": {"config.yaml": config_text()}}
    svc = service(APP, {"app": APP, COMPONENT: "model-server"}, server)
    pool = f"{APP}-{d.model.replace('.', '-')}"
    epp = f"{pool}-epp"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = {k: labels[k] for k in (COMPONENT, ENGINE_TYPE, MODEL_LABEL)}
    return {
        f"{APP}.yaml": dump(
            f"TensorRT-LLM-shaped doppelchip pods: each runs `trtllm-serve {' '.join(ARGV)}` "
            f"(doppelchip's `trtllm-serve`, the image's), its YAML from the ConfigMap "
            f"{CONFIG_MAP}: trtllm-serve's OpenAI HTTP server and {METRICS_PATH} on "
            f"{server.http_port}, doppelchip's gRPC on {server.port}. Labelled "
            f"{ENGINE_TYPE}: trtllm-serve, so llm-d's endpoint picker reads TensorRT-LLM's "
            f"series (epp.yaml); {MODEL_LABEL}: {labels[MODEL_LABEL]}, not llama-3.1-8b, so "
            "inference-gateway/'s pool (vLLM's series on /metrics) never takes them.",
            [(config_map, {"data": (
                "trtllm-serve's --config (LlmArgs): return_perf_metrics mounts "
                f"{METRICS_PATH}, enable_iter_perf_stats fills its iteration gauges, both what "
                "llm-d's trtllm-serve guide sets (the pod's --enable-metrics here).")}),
             (deployment, notes),
             (svc, {"labels": (
                 "No app.kubernetes.io/name: doppelchip, so monitoring/'s ServiceMonitor (which "
                 "scrapes /metrics, here iteration-stats JSON) leaves this Service alone; the "
                 f"pods' annotations point Prometheus at {METRICS_PATH}.")})]),
        "inferencepool.yaml": dump(
            f"An InferencePool of the trtllm-serve pods serving {MODEL} ({APP}.yaml), routed "
            "by the endpoint picker in epp.yaml on its queue, KV-usage and prefix-cache scorers.",
            [(pool_doc(pool, selector, server.http_port, epp), {})]),
        "epp.yaml": dump(
            f"The endpoint picker of {pool} ({EPP_IMAGE}, as inference-gateway/'s): watches "
            f"the pool's pods, scrapes each one's {METRICS_PATH} every 50 ms, reads it as "
            "engine type trtllm-serve (whose queue gauges, as TensorRT-LLM's, refresh only when "
            f"a request finishes: docs/TRTLLM.md) and picks a pod over Envoy ext_proc.",
            [(doc, {}) for doc in epp_objects(pool, epp, METRICS_PATH, TRTLLM_ENGINE)]),
        "gateway.yaml": dump(
            "A Gateway of its own for the HTTPRoute (listener HTTP :80), so this example and "
            "inference-gateway/ apply side by side: both routes send every path to their pool, "
            "which one Gateway could not tell apart. gatewayClassName: your implementation's.",
            [(gateway_doc(GATEWAY), {})]),
        "httproute.yaml": dump(
            f"Every path on the Gateway {GATEWAY!r} to the pool {pool!r} (the endpoint picker "
            "chooses the pod).", [(route_doc(pool, GATEWAY), {})]),
    }
