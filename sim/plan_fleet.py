"""A plan candidate as the artefacts a user runs: its fleet file (the syntax of
server/config.py that `simulate --config` and `serve --config` read), the `doppelchip
simulate` command that reproduces its result, and the deployment flags a `serve` pod takes.

The serving mode picks the fleet writer (`WRITERS`): "aggregated" is one deployment with
`replicas = N` behind the router. Disaggregated P/D pools are the extension point: a writer
that emits the P/D pool syntax of the fleet file, registered here, and "pd" in
`sim.plan_space.MODES` (docs/PLAN.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from sim.plan_exec import FLEET_PATH
from sim.plan_space import Config


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def aggregated_fleet(config: Config, replicas: int, header: str) -> str:
    """One deployment, `replicas` copies of it behind the router."""
    opts = config.options(replicas)
    fields = {"name": opts.name, "model": opts.model, "quant": opts.quant, "chip": opts.chip,
              "engine": opts.engine, "count": opts.count, "tp": opts.tp, "pp": opts.pp,
              "ep": opts.ep, "max_num_seqs": opts.max_num_seqs,
              "max_model_len": opts.max_model_len, "replicas": replicas}
    lines = [f"# {line}" for line in header.splitlines()] + ["[[deployments]]"]
    lines += [f"{k} = {_toml(v)}" for k, v in fields.items() if v is not None]
    return "\n".join(lines) + "\n"


WRITERS: dict[str, Callable[[Config, int, str], str]] = {"aggregated": aggregated_fleet}


def fleet_text(config: Config, replicas: int, header: str = "") -> str:
    try:
        writer = WRITERS[config.mode]
    except KeyError:
        raise ValueError(f"serving mode {config.mode!r} has no fleet writer yet; "
                         f"known: {', '.join(WRITERS)}") from None
    return writer(config, replicas, header)


def simulate_argv(router: str, workload_argv: list[str], slo_flag: str) -> tuple[str, ...]:
    """`simulate`'s arguments for a candidate whose fleet file is at FLEET_PATH."""
    argv = ["simulate", "--config", FLEET_PATH, "--router", router, *workload_argv]
    if slo_flag:
        argv += ["--slo", slo_flag]
    return (*argv, "--json")


def command_line(argv: tuple[str, ...], fleet_path: str) -> str:
    """The shell command `doppelchip ARGV` with the fleet file at `fleet_path`."""
    return shlex.join(["doppelchip", *(fleet_path if a == FLEET_PATH else a for a in argv)])


def deployment_flags(config: Config) -> list[str]:
    """The catalogue flags of `doppelchip serve` (and simulate) for this deployment, for a
    pod that needs no fleet file (a Kubernetes container)."""
    opts = config.options()
    flags = ["--chip", opts.chip, "--engine", opts.engine, "--model", opts.model,
             "--quant", opts.quant]
    for flag, value in (("--count", opts.count), ("--tp", opts.tp), ("--pp", opts.pp),
                        ("--ep", opts.ep), ("--max-num-seqs", opts.max_num_seqs),
                        ("--max-model-len", opts.max_model_len)):
        if value is not None:
            flags += [flag, str(value)]
    return flags
