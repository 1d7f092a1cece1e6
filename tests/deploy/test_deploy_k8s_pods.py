"""pods/ is one vLLM-shaped pod per deployment of the default fleet: the container serves exactly
its deployment on the server's default ports, the probes ask /health on the HTTP port, the
probe windows hold a busy pod and a draining one, and a cold start fits the start-up probe."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import pytest
from k8s_validation import K8S, docs_of, load_all

from server.config import load_fleet, parse_fleet
from server.engine.build import build_core
from server.server_config import ServerConfig

FLEET = load_fleet()
SERVER = FLEET.server


def objects(rel: str) -> dict[str, dict]:
    return {d["kind"]: d for d in docs_of(K8S / rel)}


def arg(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


def container(deployment: dict) -> dict:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def port_number(c: dict, port: int | str) -> int:
    """A probe's port, a number or a container port's name, as the number kubelet dials."""
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


def test_the_server_defaults_are_config_py_defaults():
    # the generator reads the default fleet's [server]; the pods must agree with both
    assert (SERVER.port, SERVER.metrics_port) == (ServerConfig().port, ServerConfig().metrics_port)


def test_one_pod_per_fleet_deployment():
    files = {f.stem for f in (K8S / "pods").glob("*.yaml")} - {"kustomization"}
    assert files == {d.name for d in FLEET.deployments}
    for d in FLEET.deployments:
        assert sorted(objects(f"pods/{d.name}.yaml")) == ["Deployment", "Service"]


@pytest.mark.parametrize("d", FLEET.deployments, ids=lambda d: d.name)
def test_the_container_serves_exactly_its_deployment(d):
    deployment = objects(f"pods/{d.name}.yaml")["Deployment"]
    c = container(deployment)
    assert c["command"] == ["doppelchip", "serve"]
    args = c["args"]
    assert arg(args, "--deployment") == d.name
    assert arg(args, "--host") == "0.0.0.0"  # inside a container: every interface
    assert int(arg(args, "--port")) == SERVER.port
    assert int(arg(args, "--http-port")) == SERVER.metrics_port
    assert "--config" not in args  # the built-in fleet, which the image installs
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "http": SERVER.metrics_port, "grpc": SERVER.port}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["llm-d.ai/model"] == d.model and labels["llm-d.ai/engine-type"] == "vllm"
    assert labels["app.kubernetes.io/instance"] == d.name
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    notes = deployment["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/port"] == str(SERVER.metrics_port)
    assert notes["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("rel", [f"pods/{d.name}.yaml" for d in FLEET.deployments]
                         + ["fleet/fleet.yaml"])
def test_probes_ask_health_on_the_http_port(rel: str):
    deployment, svc = objects(rel)["Deployment"], objects(rel)["Service"]
    c = container(deployment)
    http_port = int(arg(c["args"], "--http-port"))
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c[kind]["httpGet"]
        assert probe["path"] == "/health", kind
        assert port_number(c, probe["port"]) == http_port, kind
    # the Service routes its ports to the same container ports
    assert svc["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()
    for p in svc["spec"]["ports"]:
        assert port_number(c, p["targetPort"]) == p["port"]


@pytest.mark.parametrize("rel", [f"pods/{d.name}.yaml" for d in FLEET.deployments]
                         + ["fleet/fleet.yaml"])
def test_probe_windows_hold_a_busy_pod_and_a_draining_one(rel: str):
    spec = objects(rel)["Deployment"]["spec"]["template"]["spec"]
    c = container(objects(rel)["Deployment"])
    ready, live = c["readinessProbe"], c["livenessProbe"]
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = pre_stop + SERVER.drain_grace_s
    # a pod is killed only after the drain could have finished, never mid-drain
    assert spec["terminationGracePeriodSeconds"] > drain
    # liveness never restarts a draining pod (its /health answers 503 for the whole drain)
    assert live["failureThreshold"] * live["periodSeconds"] > drain
    # one slow answer under load does not eject a pod, nor restart it; kubelet's default
    # timeout (1 s) is what these must exceed (the slowest answer measured under 256
    # streams is in docs/ROUTERS.md)
    assert ready["failureThreshold"] >= 2 and ready["timeoutSeconds"] > 1
    assert live["timeoutSeconds"] >= ready["timeoutSeconds"]
    assert (live["failureThreshold"] * live["periodSeconds"]
            > ready["failureThreshold"] * ready["periodSeconds"])
    assert "cpu" not in c["resources"].get("limits", {})  # no CFS throttling of the probes


def generator():
    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def startup_window(c: dict) -> float:
    probe = c["startupProbe"]
    return probe["failureThreshold"] * probe["periodSeconds"]


def test_a_cold_start_fits_the_startup_probe():
    """A `cold` deployment builds its engine before /health answers 200: the start-up probe's
    window covers the build (emulated seconds x time_scale, as the engine process waits it)
    on top of what a prebuilt one gets."""
    gen = generator()
    doc = {"server": {"time_scale": 0.5}, "deployments": [
        {"name": "trt", "model": "llama-3.1-8b", "quant": "fp8", "chip": "h100-sxm",
         "engine": "tensorrt-llm", "built_for": "hopper", "start": "cold"},
        {"name": "warm", "model": "llama-3.1-8b", "quant": "fp8", "chip": "h100-sxm",
         "engine": "tensorrt-llm", "built_for": "hopper"}]}
    fleet = parse_fleet(doc, "test fleet")
    files = gen.render(fleet)
    cold_opts = fleet.deployments[0]
    build_s = build_core(cold_opts).compiler.startup_seconds(True) * fleet.server.time_scale
    assert build_s > 60  # a real build: the case the window must grow for
    cold = container(next(d for d in load_all(files["pods/trt.yaml"])
                          if d["kind"] == "Deployment"))
    warm = container(next(d for d in load_all(files["pods/warm.yaml"])
                          if d["kind"] == "Deployment"))
    assert startup_window(cold) >= startup_window(warm) + build_s
    # prebuilt: no build to wait for, so its window is the process start alone
    warm_opts = dataclasses.replace(cold_opts, start="prebuilt")
    assert build_core(warm_opts).compiler.startup_seconds(False) == 0
    assert math.isclose(startup_window(warm), gen.PROCESS_START_S, abs_tol=gen.STARTUP_PERIOD_S)


def test_data_parallel_ranks_get_their_cores():
    gen = generator()
    base = {"name": "dp", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
            "engine": "vllm"}
    one = gen.render(parse_fleet({"deployments": [base]}))
    four = gen.render(parse_fleet({"deployments": [{**base, "data_parallel_size": 4}]}))
    cpu = [float(container(load_all(f["pods/dp.yaml"])[0])["resources"]["requests"]
                 ["cpu"]) for f in (one, four)]
    assert cpu == [1.0, 4.0]


def test_pod_args_parse_with_the_serve_command():
    """The container's command line is one `doppelchip serve` accepts (the pod-mode flags
    come with the pod-mode CLI; until it is merged, this says so instead of passing)."""
    from doppelchip.cli import build_parser

    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # argparse keeps no API
    flags = {s for a in serve._actions for s in a.option_strings}
    if not {"--deployment", "--http-port"} <= flags:
        pytest.skip("pod-mode CLI (serve --deployment/--http-port) is not in this tree yet")
    for d in FLEET.deployments:
        c = container(objects(f"pods/{d.name}.yaml")["Deployment"])
        parser.parse_args([*c["command"][1:], *c["args"]])  # exits (fails) if refused
