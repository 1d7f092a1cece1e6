"""A status for a call that has already ended is not an error (`server.wire.abort`,
`server.wire.end_stream`).

grpc.aio learns that a client cancelled, or that a call's deadline passed, from a callback
that can run after the handler's next send. A handler that aborts in that window has its
status refused by core (`ExecuteBatchError`), and grpc.aio logs that as an ERROR with a
traceback; the fuzzer met it once in a CI run (an undecodable request with a 50 ms deadline on
a busy server). `wire.abort` ends such a handler with `CancelledError` instead, which grpc.aio
logs at DEBUG. These tests drive it with a stand-in context: the window cannot be hit on
purpose against a real server.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc._cython.cygrpc import ExecuteBatchError

from server import wire


class Context:
    """The part of grpc.aio's ServicerContext that `wire.abort` uses."""

    def __init__(self, *, remaining: float | None = None, refuse: bool = False,
                 cancelled: bool = False) -> None:
        self.remaining = remaining
        self.refuse = refuse
        self.is_cancelled = cancelled
        self.sent: list[tuple[grpc.StatusCode, str]] = []

    def cancelled(self) -> bool:
        return self.is_cancelled

    def done(self) -> bool:
        return bool(self.sent)

    def time_remaining(self) -> float | None:
        return self.remaining

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        if self.refuse:
            raise ExecuteBatchError("Failed \"execute_batch\": (SendStatusFromServerOperation,)")
        self.sent.append((code, details))
        raise grpc.aio.AbortError("Locally aborted.")

    async def send_initial_metadata(self, metadata) -> None:
        if self.refuse:
            raise ExecuteBatchError("Failed \"execute_batch\": (SendInitialMetadataOperation,)")


async def test_a_live_call_gets_its_status():
    context = Context(remaining=5.0)
    with pytest.raises(grpc.aio.AbortError):
        await wire.abort(context, grpc.StatusCode.NOT_FOUND, "no such deployment")
    assert context.sent == [(grpc.StatusCode.NOT_FOUND, "no such deployment")]


@pytest.mark.parametrize("ended", [{"remaining": 0.0}, {"cancelled": True}],
                         ids=["deadline passed", "client cancelled"])
async def test_an_ended_call_is_not_sent_a_status(ended):
    context = Context(**ended)
    with pytest.raises(asyncio.CancelledError):
        await wire.abort(context, grpc.StatusCode.UNAVAILABLE, "server is draining")
    assert context.sent == []


async def test_a_status_refused_by_core_ends_the_handler_as_cancelled():
    context = Context(remaining=1e-3, refuse=True)  # the deadline passes during the send
    with pytest.raises(asyncio.CancelledError):
        await wire.reject(wire.Undecodable("bad utf-8"), context)


async def test_headers_refused_by_core_end_the_stream_as_cancelled():
    """As an abort refused by core: the handler ends as cancelled, so grpc.aio sends no final
    status (a handler that returned had it send the headers again with the status, which core
    refused as too many operations, logged by grpc.aio as an ERROR: CI's cancellation storm
    caught it once)."""
    with pytest.raises(asyncio.CancelledError):
        await wire.send_headers(Context(remaining=1e-3, refuse=True), ())
    assert await wire.send_headers(Context(remaining=5.0), ()) is None  # sent


@pytest.mark.parametrize(("ended", "cancelled"), [
    ({"remaining": 0.0}, True), ({"cancelled": True}, True), ({"remaining": 5.0}, False),
    ({}, False)], ids=["deadline passed", "client cancelled", "live", "no deadline"])
def test_a_stream_that_ended_for_its_client_ends_as_cancelled(ended, cancelled):
    """A streaming handler's own end: grpc.aio would send an OK status after the last message,
    refused by core once the call is over (an ERROR in the log); the handler ends as
    cancelled instead, and a live call ends normally."""
    if cancelled:
        with pytest.raises(asyncio.CancelledError):
            wire.end_stream(Context(**ended))
    else:
        assert wire.end_stream(Context(**ended)) is None
