"""Shared by the macro-stepping tests: count the steps macro windows ran."""

from __future__ import annotations

import sim.virtual_macro as virtual_macro
from server.engine.macro import Window


def count_window_steps(monkeypatch) -> list[int]:
    """Patch `virtual_macro.advance` to count the steps of the windows it runs; the count is
    the list's one item, read after the run."""
    steps = [0]
    real = virtual_macro.advance

    def counting(*a, **k):
        out = real(*a, **k)
        steps[0] += len(out.seconds) if isinstance(out, Window) else 0
        return out

    monkeypatch.setattr(virtual_macro, "advance", counting)
    return steps
