"""Typed errors raised by the device layer.

The service maps them to status codes: an unknown id or a deployment that cannot be placed is the
user's mistake (INVALID_ARGUMENT / FAILED_PRECONDITION), never a crash.
"""

from __future__ import annotations


class DeviceError(Exception):
    """Base class of every error raised by ``devices``."""


class UnknownId(DeviceError, KeyError):
    """A chip, engine, model or quantisation id that is not in the catalogue."""

    def __init__(self, kind: str, ident: str, known: list[str]) -> None:
        self.kind = kind
        self.ident = ident
        self.known = known
        super().__init__(f"unknown {kind} {ident!r}; known: {', '.join(known)}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0])


class PlacementError(DeviceError):
    """The deployment cannot be placed (does not fit, wrong chip for the engine, ...)."""


class ShapeError(DeviceError):
    """A batch is outside what a compiled engine accepts (e.g. TensorRT-LLM build limits)."""
