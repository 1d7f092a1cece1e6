"""API keys (`--api-key`, as vLLM's flag): one check for both protocols, and the gRPC half.

`ApiKeys` holds the server's keys as SHA-256 digests and checks an `Authorization` value the
way vLLM's `AuthenticationMiddleware` does (0.33.0, read at commit baaf6e9:
`vllm/entrypoints/serve/middleware/authenticate.py`): the scheme before the first space must
be `Bearer` (any case), the rest is the key, compared against every configured key with
`hmac.compare_digest` on the digests — the time taken says nothing about how much of a key
matched, nor which key.

gRPC: `ApiKeyInterceptor` requires metadata `authorization: Bearer KEY` on every method except
those of the open services (standard health and reflection, which probes and `grpcurl` use
without credentials); a call without a valid key ends UNAUTHENTICATED before its request is
even deserialized. HTTP: `server.http.app` applies the same `ApiKeys` to its guarded routes.

This module exists so that the rule "which key is valid" lives in one place: the HTTP
middleware, the gRPC interceptor and any servicer that must know whether its caller holds a
key (`has_api_key`) ask it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable, Sequence

import grpc

from server import wire

# Services any caller may use with --api-key on: probes and tooling, as vLLM leaves /health
# and /metrics open on HTTP.
OPEN_GRPC_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)

UNAUTHENTICATED_MESSAGE = ("missing or invalid API key: send metadata "
                           "'authorization: Bearer <key>'")


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class ApiKeys:
    """The configured keys. Empty: authentication is off (every caller is accepted)."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._digests = tuple(_digest(k.encode("utf-8")) for k in keys if k)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def verify(self, authorization: str | bytes | None) -> bool:
        """Whether an `Authorization` value (text, or the raw header bytes: a key is compared
        as its UTF-8 bytes) carries one of the keys (`Bearer KEY`). With no keys configured,
        every value (None included) passes."""
        if not self._digests:
            return True
        if not authorization:
            return False
        raw = authorization.encode("utf-8") if isinstance(authorization, str) else authorization
        scheme, _, key = raw.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        candidate = _digest(key)
        found = False
        for digest in self._digests:  # no early exit: the time does not say which key
            found |= hmac.compare_digest(candidate, digest)
        return found

    def verify_metadata(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        """Whether gRPC invocation metadata carries a key (the first `authorization` entry)."""
        if not self._digests:
            return True
        for key, value in metadata or ():
            if key == "authorization":
                return self.verify(value)
        return False


def has_api_key(keys: ApiKeys, context: grpc.aio.ServicerContext) -> bool:
    """Whether a servicer's caller presented a valid key (False when keys are off: then
    nobody holds one)."""
    return bool(keys) and keys.verify_metadata(context.invocation_metadata())


async def _refuse(request: object, context: grpc.aio.ServicerContext) -> None:
    await wire.abort(context, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)


async def _refuse_stream(request: object, context: grpc.aio.ServicerContext):
    await wire.abort(context, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
    yield  # pragma: no cover - an async generator, as a streaming handler is


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that refuses at once. It takes the request as
    raw bytes (no deserializer): an unauthenticated caller gets none of the server's parsing."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_refuse_stream)
    return grpc.unary_unary_rpc_method_handler(_refuse)


def _service(method: str) -> str:
    """`/pkg.Service/Method` → `pkg.Service`."""
    return method.lstrip("/").split("/", 1)[0]


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for a call without `authorization: Bearer KEY`, except on the open
    services (health, reflection)."""

    def __init__(self, keys: ApiKeys, open_services: Sequence[str] = OPEN_GRPC_SERVICES) -> None:
        self.keys, self.open = keys, frozenset(open_services)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or _service(details.method) in self.open:
            return handler
        if self.keys.verify_metadata(details.invocation_metadata):
            return handler
        return _refusal(handler)
