"""A plan candidate as the artefacts a user runs: its fleet file (the syntax of
server/config.py that `simulate --config` and `serve --config` read), the `doppelchip
simulate` command that reproduces its result, and the deployment flags a `serve` pod takes.

The serving mode picks the fleet writer (`WRITERS`), which takes the candidate's configs and
replica counts, one per pool: "aggregated" is one deployment with `replicas = N` behind the
router; "pd" a prefill pool and a decode pool (of one shape or two), in the fleet file's P/D
syntax (`role = "prefill" | "decode"`), offered by `sim.plan_space.MODES` once the fleet file
knows `role` (docs/PLAN.md).
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


def _table(config: Config, replicas: int, name: str, role: str | None = None) -> list[str]:
    opts = config.options(replicas)
    fields = {"name": name, "model": opts.model, "quant": opts.quant, "chip": opts.chip,
              "engine": opts.engine, "count": opts.count, "tp": opts.tp, "pp": opts.pp,
              "ep": opts.ep, "max_num_seqs": opts.max_num_seqs,
              "data_parallel_size": opts.data_parallel_size if config.dp > 1 else None,
              "kv_offloading_size": opts.kv_offloading_size,
              "max_model_len": opts.max_model_len, "hf_overrides": opts.hf_overrides,
              "pooler_config": opts.pooler_config,
              "replicas": replicas, "role": role}
    return ["[[deployments]]"] + [f"{k} = {_toml(v)}" for k, v in fields.items()
                                  if v is not None]


def _comment(header: str) -> list[str]:
    return [f"# {line}" for line in header.splitlines()]


def aggregated_fleet(configs: tuple[Config, ...], counts: tuple[int, ...], header: str) -> str:
    """One deployment, `counts[0]` copies of it behind the router."""
    (config,), (replicas,) = configs, counts
    return "\n".join(_comment(header) + _table(config, replicas, config.name)) + "\n"


def pd_names(configs: tuple[Config, ...]) -> dict[str, str]:
    """Role -> the pool's deployment name in a P/D fleet file (`SHAPE-prefill`, ...)."""
    return {role: f"{c.name}-{role}" for role, c in zip(("prefill", "decode"), configs,
                                                       strict=True)}


def pd_fleet(configs: tuple[Config, ...], counts: tuple[int, ...], header: str) -> str:
    """A prefill pool of `counts[0]` replicas of `configs[0]` and a decode pool of
    `counts[1]` of `configs[1]` (the same shape or another)."""
    names = pd_names(configs)
    (pc, dc), (prefill, decode) = configs, counts
    return "\n".join(_comment(header) + _table(pc, prefill, names["prefill"], "prefill")
                     + [""] + _table(dc, decode, names["decode"], "decode")) + "\n"


WRITERS: dict[str, Callable[[tuple[Config, ...], tuple[int, ...], str], str]] = {
    "aggregated": aggregated_fleet, "pd": pd_fleet}


def fleet_text(configs: Config | tuple[Config, ...], counts: int | tuple[int, ...],
               header: str = "") -> str:
    """The candidate's fleet file: `counts` replicas per pool (an int: one pool) of
    `configs`, one per pool (one config: every pool of it)."""
    counts = (counts,) if isinstance(counts, int) else tuple(counts)
    if isinstance(configs, Config):
        configs = (configs,) * len(counts)
    mode = configs[0].mode
    try:
        writer = WRITERS[mode]
    except KeyError:
        raise ValueError(f"serving mode {mode!r} has no fleet writer; "
                         f"known: {', '.join(WRITERS)}") from None
    return writer(tuple(configs), counts, header)


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
    ranks = opts.data_parallel_size if config.dp > 1 else None
    flags = ["--chip", opts.chip, "--engine", opts.engine, "--model", opts.model,
             "--quant", opts.quant]
    for flag, value in (("--count", opts.count), ("--tp", opts.tp), ("--pp", opts.pp),
                        ("--ep", opts.ep),
                        ("--data-parallel-size", ranks),
                        ("--kv-offloading-size", opts.kv_offloading_size),
                        ("--max-num-seqs", opts.max_num_seqs),
                        ("--max-model-len", opts.max_model_len),
                        ("--hf-overrides", opts.hf_overrides),
                        ("--pooler-config", opts.pooler_config)):
        if value is not None:
            flags += [flag, str(value)]
    return flags


def label(rec: dict) -> str:
    """A candidate as people read it: `3 × SHAPE`; P/D `1 prefill × SHAPE + 2 decode × SHAPE`
    (each pool's shape, the same or not)."""
    if "pools" not in rec:
        return f"{rec['replicas']} × {rec['deployment']}"
    return " + ".join(f"{n} {role} × {rec['pool_shapes'][role]['deployment'][:-len(role) - 1]}"
                      for role, n in rec["pools"].items())
