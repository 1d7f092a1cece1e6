"""`--profiler-config`: vLLM 0.33.0's profiler JSON (`vllm/config/profiler.py`), checked once.

vLLM mounts `/start_profile` and `/stop_profile` only when `profiler` is set, and its workers
then write a torch-profiler trace per worker into `torch_profiler_dir`. doppelchip's engine
cores write the emulated engine's steps as such a trace (`server/engine_proc/profiler.py`), so
`profiler` must be "torch" here: "cuda" (an nsys capture range) and "proton" (Triton kernels)
profile hardware that is not there, and are refused by name rather than accepted silently.

Honoured: `torch_profiler_dir` (required, as vLLM requires it; made absolute as vLLM makes it),
`torch_profiler_use_gzip`, `delay_iterations`, `max_iterations`. Every other key of vLLM's
`ProfilerConfig` is accepted and has nothing to act on; an unknown key is refused, as vLLM's
config class refuses it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from server.engine.json_config import json_object

_KEYS = {
    "profiler", "torch_profiler_dir", "torch_profiler_activities", "proton_profiler_dir",
    "proton_context", "proton_data", "proton_backend", "proton_mode", "proton_hook",
    "proton_output_format", "proton_graph_attribution", "torch_profiler_with_stack",
    "torch_profiler_with_flops", "torch_profiler_use_gzip",
    "torch_profiler_dump_cuda_time_total", "torch_profiler_record_shapes",
    "torch_profiler_with_memory", "capture_torch_profiler", "detailed_trace_annotation",
    "ignore_frontend", "delay_iterations", "max_iterations", "warmup_iterations",
    "active_iterations", "wait_iterations",
}


@dataclass(frozen=True)
class ProfilerConfig:
    profiler: str | None = None  # None: no profiling routes (vLLM's default)
    torch_profiler_dir: str = ""
    torch_profiler_use_gzip: bool = True
    delay_iterations: int = 0  # engine steps skipped after /start_profile
    max_iterations: int = 0  # engine steps recorded at most (0: until /stop_profile)

    @property
    def enabled(self) -> bool:
        return self.profiler is not None

    @classmethod
    def parse(cls, text: str | None) -> ProfilerConfig:
        """The JSON of `--profiler-config` ("" or None: profiling off); ValueError saying what
        is wrong."""
        if not text:
            return cls()
        doc = json_object(text, "profiler_config", _KEYS)
        profiler = doc.get("profiler")
        if profiler not in (None, "torch", "cuda", "proton"):
            raise ValueError(f"profiler_config: profiler must be 'torch', 'cuda' or 'proton', "
                             f"got {profiler!r}")
        if profiler in ("cuda", "proton"):
            raise ValueError(f"profiler_config: profiler {profiler!r} profiles hardware an "
                             "emulated engine does not have; doppelchip writes its steps as a "
                             "torch-profiler trace: use 'torch'")
        directory = doc.get("torch_profiler_dir", "")
        if not isinstance(directory, str):
            raise ValueError("profiler_config: torch_profiler_dir must be a string")
        if directory and profiler != "torch":
            raise ValueError("torch_profiler_dir is only applicable when profiler is set to "
                             "'torch'")
        if profiler == "torch" and not directory:
            raise ValueError("torch_profiler_dir must be set when profiler is 'torch'")
        if "://" in directory:
            raise ValueError("profiler_config: torch_profiler_dir must be a local directory "
                             "(no network at run time)")
        gzip = doc.get("torch_profiler_use_gzip", True)
        if not isinstance(gzip, bool):
            raise ValueError("profiler_config: torch_profiler_use_gzip must be true or false")
        bounds = {k: doc.get(k, 0) for k in ("delay_iterations", "max_iterations")}
        for key, value in bounds.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"profiler_config: {key} must be an integer >= 0")
        return cls(profiler, os.path.abspath(os.path.expanduser(directory)) if directory else "",
                   gzip, **bounds)


def validate_profile_prefix(prefix: str | None) -> None:
    """vLLM's check of a session's `profile_prefix` (a trace file name's start)."""
    if prefix is None:
        return
    if (not 1 <= len(prefix) <= 128 or not prefix.isascii() or not prefix[0].isalnum()
            or any(not (c.isalnum() or c in "._-") for c in prefix[1:])):
        raise ValueError("profile_prefix must be 1-128 ASCII characters, start with a letter "
                         "or number, and contain only letters, numbers, '.', '_', or '-'")


def validate_profile_iteration_bounds(delay_iterations: int | None,
                                      max_iterations: int | None) -> None:
    """vLLM's check of a session's iteration bounds."""
    if delay_iterations is not None and delay_iterations < 0:
        raise ValueError("delay_iterations must be greater than or equal to 0")
    if max_iterations is not None and max_iterations < 0:
        raise ValueError("max_iterations must be greater than or equal to 0")
