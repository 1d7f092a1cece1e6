"""Which data-parallel ranks a `vllm serve` pod runs: vLLM 0.33.0's launch modes.

Why a module of its own: vLLM decides it from eight flags (`EngineArgs.create_engine_config`
and `vllm/entrypoints/cli/serve.py`), and wide expert-parallel manifests (llm-d's, one pod per
node or per rank under a LeaderWorkerSet) use every mode:

- internal load balancing (the default): one API server in front of all `--data-parallel-size`
  ranks. When some of them run on other nodes (`--data-parallel-size-local` < size, the other
  nodes `--headless`), doppelchip's leader pod emulates every rank itself and the headless
  pods idle (`HEADLESS`);
- hybrid (`--data-parallel-start-rank S` or `--data-parallel-hybrid-lb`, with
  `--data-parallel-size-local L`): this pod serves ranks S .. S+L-1 behind its own API server;
- external (`--data-parallel-rank R` or `--data-parallel-external-lb`): this pod serves rank R
  alone; a MoE model only, as in vLLM.

`--nnodes`/`--node-rank` infer the rank or the local size as vLLM does. The errors are vLLM's,
and so are vLLM 0.34.0's two for `--enable-fault-tolerance` (`EngineArgs.create_engine_config`,
`ParallelConfig._validate_parallel_config`): it needs external load balancing and one API
server (its routes and engine side: server/engine_proc/sentinel.py).
"""

from __future__ import annotations

import argparse

# printed by a `--headless` pod, which then waits for SIGTERM (cmd_vllm)
HEADLESS = ("--headless: the pod of data-parallel rank 0 (the one with the API server) "
            "emulates every rank of the group, so this worker runs no engine; it waits for "
            "SIGTERM, as a headless vLLM node serves no HTTP")


def local_ranks(args: argparse.Namespace, is_moe: bool) -> tuple[int, int | None]:
    """(first rank, how many) this pod serves; (0, None) for all of them. ValueError with
    vLLM's words for a combination vLLM refuses."""
    size = args.data_parallel_size or 1
    rank, start, local = args.data_parallel_rank, args.data_parallel_start_rank, \
        args.data_parallel_size_local
    nnodes, node_rank = int(args.nnodes or 1), int(args.node_rank or 0)
    external = bool(args.data_parallel_external_lb)
    hybrid = bool(args.data_parallel_hybrid_lb)
    if hybrid and args.headless:
        raise ValueError("data_parallel_hybrid_lb is not applicable in headless mode")
    if hybrid and external:
        raise ValueError("Invalid data-parallel launch options: `--data-parallel-hybrid-lb` "
                         "and `--data-parallel-external-lb` cannot be enabled together. "
                         "Enable only one load-balancing mode.")
    if (external or rank is not None) + (hybrid or (start is not None and not args.headless)) > 1:
        raise ValueError("Cannot use more than one data parallel load balancing mode. Choose "
                         "one of: --data-parallel-multi-port-external-lb, "
                         "--data-parallel-external-lb (or --data-parallel-rank), "
                         "--data-parallel-hybrid-lb (or --data-parallel-start-rank).")
    inferred = 0
    if nnodes > 1:
        within = (args.tp or 1) * (args.pp or 1)
        world = size * within
        if world % nnodes:
            raise ValueError(f"Invalid data-parallel launch options: `--nnodes {nnodes}` must "
                             f"evenly divide the total world size ({world}).")
        if not 0 <= node_rank < nnodes:
            raise ValueError("Invalid data-parallel launch options: `--node-rank` must be "
                             f"between 0 and {nnodes - 1}; got `--node-rank {node_rank}`.")
        inferred = node_rank * (world // nnodes) // within
        if size > 1 and external and rank is None:
            if nnodes % size:
                raise ValueError("Invalid data-parallel launch options: `--node-rank` cannot "
                                 "unambiguously identify external data-parallel ranks when "
                                 "`--nnodes` is not divisible by `--data-parallel-size`. Set a "
                                 "unique `--data-parallel-rank` for each external-LB process.")
            rank = inferred
        elif local is None and not external:
            local = max(world // nnodes // within, 1)
    if (getattr(args, "enable_fault_tolerance", None)  # vLLM 0.34.0's, in this order (a
            or getattr(args, "fault_tolerance_config", None) is not None):  # config enables it
        if not (external or rank is not None):
            raise ValueError("Fault tolerance requires external load balancer mode "
                             "(--data-parallel-external-lb or --data-parallel-rank). Internal LB "
                             "mode is not supported.")
        if (args.api_server_count or 1) > 1:
            raise ValueError("Fault tolerance requires a single API server process "
                             "(--api-server-count=1), but got "
                             f"{args.api_server_count}. The FT system assumes one AsyncMPClient "
                             "manages all engines.")
    if external or rank is not None:
        if size > 1 and not is_moe:
            raise ValueError("Non-MoE models do not support external data parallel mode. For "
                             "external load balancing, launch independent vLLM instances "
                             "without --data-parallel-* arguments.")
        if rank is None:
            raise ValueError("Invalid data-parallel launch options: `--data-parallel-external-"
                             "lb` requires a data-parallel rank. Set `--data-parallel-rank`.")
        if local not in (1, None):
            raise ValueError("Invalid data-parallel launch options: an external data-parallel "
                             f"rank requires `--data-parallel-size-local 1`; got {local}.")
        return _checked(rank, 1, size)
    if local is None:
        if hybrid:
            raise ValueError("Invalid data-parallel launch options: `--data-parallel-hybrid-lb` "
                             "requires `--data-parallel-size-local`. Set it to the number of "
                             "data-parallel ranks on this node.")
        return 0, None
    hybrid = (hybrid or (start is not None and not args.headless)) and local != size
    first = start if start is not None else inferred
    if hybrid:  # (with one local rank, vLLM switches to external: the same ranks)
        return _checked(first, local, size)
    return 0, None  # internal load balancing: the leader emulates the remote ranks too


def _checked(first: int, count: int, size: int) -> tuple[int, int]:
    if first < 0 or first + count > size:
        raise ValueError(f"data-parallel ranks {first}..{first + count - 1} are outside the "
                         f"{size} of --data-parallel-size")
    return first, count
