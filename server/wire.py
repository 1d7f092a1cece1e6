"""Registering a gRPC service whose messages may not decode.

Why not the generated `add_*Servicer_to_server`: its deserializer is `Message.FromString`,
which raises on a string field that is not valid UTF-8 (or any malformed message), and
grpc.aio answers that with UNKNOWN and logs a traceback. Here the deserializer returns an
`Undecodable` instead, and the method answers INVALID_ARGUMENT with a message: unary methods
through a wrapper added here; streaming methods (the hot path, where a wrapper would cost a
generator layer per message) check `type(request) is Undecodable` themselves and call
`reject`.

A method of the service that the servicer does not implement (it is not a coroutine or an
async generator: the generated base class's stub, which raises NotImplementedError and makes
grpc.aio log a traceback) answers UNIMPLEMENTED with a message instead.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from grpc._cython.cygrpc import ExecuteBatchError  # what grpc.aio raises for a refused batch


class Undecodable:
    """A request message that did not decode; `error` says why."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


async def reject(request: Undecodable, context: grpc.aio.ServicerContext) -> None:
    await abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                f"the request message does not decode ({request.error}); string fields must "
                "be valid UTF-8")


def _deserializer(cls: Any) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except (DecodeError, UnicodeDecodeError, ValueError) as e:
            return Undecodable(str(e) or type(e).__name__)
    return decode


def _unary(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if type(request) is Undecodable:
            await reject(request, context)
        return await method(request, context)
    return checked


def _unimplemented(name: str, streaming: bool) -> Callable[..., Any]:
    message = f"{name} is not served by doppelchip"

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort(context, grpc.StatusCode.UNIMPLEMENTED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort(context, grpc.StatusCode.UNIMPLEMENTED, message)
        yield  # an async generator, as grpc.aio expects of a streaming method

    return stream if streaming else unary


def add_service(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor) -> None:
    """Register every method of `service` on `server`, served by `servicer`'s method of the
    same name (unary-unary and unary-stream methods only: the services here have no others)."""
    handlers = {}
    for m in service.methods:
        assert not m.client_streaming, f"{service.full_name}/{m.name}: client streaming"
        req = message_factory.GetMessageClass(m.input_type)
        resp = message_factory.GetMessageClass(m.output_type)
        behaviour = getattr(servicer, m.name, None)  # absent: UNIMPLEMENTED, as grpc's base
        if not (inspect.iscoroutinefunction(behaviour)
                or inspect.isasyncgenfunction(behaviour)):
            behaviour = _unimplemented(f"{service.full_name}/{m.name}", m.server_streaming)
        make = (grpc.unary_stream_rpc_method_handler if m.server_streaming
                else grpc.unary_unary_rpc_method_handler)
        handlers[m.name] = make(behaviour if m.server_streaming else _unary(behaviour),
                                request_deserializer=_deserializer(req),
                                response_serializer=resp.SerializeToString)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def ended(context: grpc.aio.ServicerContext) -> bool:
    """Whether the call is over for the client: it cancelled, a status went out, or its
    deadline passed. grpc.aio learns of a cancel or an expired deadline from a callback
    that may run after the handler's next send, so a handler checks this before sending a
    status: the send would be refused."""
    if context.cancelled() or context.done():
        return True
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


def end_stream(context: grpc.aio.ServicerContext) -> None:
    """A streaming handler's own end, after its last message: when the call is already over
    for the client (its deadline passed, it cancelled), raise `CancelledError`, so grpc.aio
    sends no final status. Returning instead had grpc.aio send an OK that core refused, which
    it logged as an ERROR with a traceback (the fuzzer met it: a stream that finished as its
    50 ms deadline passed). The window between this check and grpc.aio's send stays open,
    narrower than a whole last message."""
    if ended(context):
        raise asyncio.CancelledError("the call ended before its status was sent")


async def send_headers(context: grpc.aio.ServicerContext, metadata) -> None:
    """Send a streaming call's response headers. When the call ended first (a client that
    cancels at once: core refuses or fails the batch) this raises `CancelledError`, as
    `abort` does, so the handler's `finally` frees what the engine holds and grpc.aio sends
    no status. A handler that returned instead had grpc.aio send its final status with the
    headers again, which core refused (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS: it had taken
    the failed headers) and grpc.aio logged as an ERROR with a traceback."""
    try:
        await context.send_initial_metadata(metadata)
    except ExecuteBatchError as e:  # core refused the batch: the call ended under it
        raise asyncio.CancelledError("the call ended before its headers were sent") from e
    except Exception:
        if ended(context):
            raise asyncio.CancelledError("the call ended before its headers were sent") \
                from None
        raise


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """End the handler with `code` and `details` (`context.abort`, which raises); every
    abort of the servicers goes through here.

    When the call has already ended for the client (`ended`), or ends while the status is
    being sent (core refuses the batch: the cancel or the deadline had reached core but not
    yet grpc.aio's callback), there is nobody to tell: this raises `CancelledError`, what
    grpc.aio itself raises into a handler whose client left, and what it logs at DEBUG.
    Left to itself, grpc.aio would log the refused batch as an ERROR with a traceback."""
    if ended(context):
        raise asyncio.CancelledError("the call ended before its status was sent")
    try:
        await context.abort(code, details)
    except ExecuteBatchError as e:
        raise asyncio.CancelledError("the call ended while its status was sent") from e
