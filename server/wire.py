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

import functools
import inspect
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError


class Undecodable:
    """A request message that did not decode; `error` says why."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


async def reject(request: Undecodable, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"the request message does not decode ({request.error}); string "
                        "fields must be valid UTF-8")


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
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)
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
        behaviour = getattr(servicer, m.name)
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


async def send_headers(context: grpc.aio.ServicerContext, metadata) -> bool:
    """Send a streaming call's response headers; False when the call ended first (a client
    that cancels at once: grpc refuses the batch and would log a traceback), so the handler
    returns and its `finally` frees what the engine holds."""
    try:
        await context.send_initial_metadata(metadata)
    except Exception:
        if context.cancelled() or context.done():
            return False
        raise
    return True


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """`context.abort` (which raises, ending the handler), unless the client already left: a
    cancelled call takes no status (grpc would refuse the batch and log a traceback), so this
    returns and the handler must return after it."""
    if context.cancelled() or context.done():
        return
    await context.abort(code, details)
