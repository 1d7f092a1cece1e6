"""The plan's winner as Kubernetes manifests: deploy/k8s/generate.py's vLLM-shaped pod (its
probes, drain, resources, labels) and Service, with `replicas` set to the winner's count and
the container running the deployment from catalogue flags (no fleet file to mount), plus a
kustomization. The generator is the repository's script, loaded from its file (it, not sim/,
reads the server's config), so the manifests cannot drift from the committed ones' shape.
Needs the source tree (deploy/ is not a package) and PyYAML (the dev extra), and says so when
either is missing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from sim.plan_space import Config

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"


def generator() -> ModuleType:
    path = K8S / "generate.py"
    if not path.is_file():
        raise RuntimeError(f"--write-k8s needs the source tree's {path} (not installed)")
    if "deploy_k8s_generate" in sys.modules:
        return sys.modules["deploy_k8s_generate"]
    spec = importlib.util.spec_from_file_location("deploy_k8s_generate", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)  # it puts deploy/k8s on sys.path for its siblings
    except ImportError as e:
        raise RuntimeError(f"--write-k8s: {e} (pip install 'doppelchip[dev]')") from e
    sys.modules["deploy_k8s_generate"] = module
    return module


def config_of(rec: dict[str, Any], mode: str | None = None) -> Config:
    """The config of a candidate's record, or of one of its `pool_shapes`."""
    return Config(rec["chip"], rec["engine"], rec["quant"], rec["model"], rec["tp"], rec["pp"],
                  rec["ep"], rec["count"], rec["max_num_seqs"], rec.get("max_model_len"),
                  mode or rec["mode"], rec.get("dp", 1), rec.get("kv_offloading_size"),
                  rec.get("hf_overrides"), rec.get("pooler_config"))


# P/D pods as llm-d's P/D guides run them: both pools' vLLM takes the NIXL connector in both
# directions (the routing sidecar decides which side prefills), and the `llm-d.ai/role` label
# (prefill | decode) is what the endpoint picker's prefill and decode filters select on
PD_KV_TRANSFER = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
ROLE_LABEL = "llm-d.ai/role"


def manifests(rec: dict[str, Any]) -> dict[str, str]:
    """File name → YAML text: a Deployment + Service per pool of the winner (one for an
    aggregated fleet; a P/D fleet's prefill and decode pools, each labelled with its role and
    taking the KV connector), and a kustomization."""
    from sim.plan_fleet import deployment_flags

    if rec["mode"] not in ("aggregated", "pd"):
        raise RuntimeError(f"--write-k8s: {rec['mode']} fleets are not written yet "
                           "(aggregated and pd only)")
    gen = generator()
    server = gen.ServerConfig()  # the server's defaults, as the generator reads them
    pools: dict[str | None, int] = rec.get("pools") or {None: rec["replicas"]}
    files = {}
    for role, replicas in pools.items():
        shape = rec["pool_shapes"][role] if role is not None else rec
        config = config_of(shape, rec["mode"])
        opts = config.options(replicas)
        base = opts.name if role is None else shape["deployment"]
        name = gen.k8s_name("doppelchip-plan", base)
        labels = gen.pod_labels(name, opts)
        flags = deployment_flags(config)
        if role is not None:
            labels[ROLE_LABEL] = role
            flags += ["--kv-transfer-config", PD_KV_TRANSFER]
        svc_labels = {k: labels[k] for k in (gen.NAME, "app.kubernetes.io/instance",
                                             gen.COMPONENT)}
        doc = gen.pod(name, labels, flags, gen.startup_seconds(opts, server),
                      opts.local_ranks, opts.local_ranks, server)
        doc["spec"]["replicas"] = replicas
        what = f"{replicas} replicas of {opts.name}" + (f" ({role} pool)" if role else "")
        header = (f"doppelchip plan's winner: {what} (${rec['usd_per_hour']:.4g}/hour emulated "
                  "for the fleet), one vLLM-shaped pod each.")
        files[f"{base}.yaml"] = gen.dump(header, [(doc, gen.probe_notes(server)),
                                                  (gen.service(name, svc_labels, server), {})])
    files["kustomization.yaml"] = gen.kustomization(sorted(files))
    note = sys.modules["emit"].NOTE  # the generator's "do not edit" line names its own input
    return {n: t.replace(note, "Written by `doppelchip plan --write-k8s` (deploy/k8s/"
                         "generate.py's pod).") for n, t in files.items()}


def write_k8s(rec: dict[str, Any], out_dir: str) -> list[str]:
    """Write `manifests(rec)` into `out_dir`; the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in manifests(rec).items():
        (out / name).write_text(text)
        written.append(str(out / name))
    return written
