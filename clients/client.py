"""Python client library for doppelchip.v1.Inference: async (`AsyncClient`) and sync (`Client`).

    async with AsyncClient("127.0.0.1:50051") as client:
        async for chunk in client.generate("hello", max_tokens=32):
            print(chunk.text, end="")

Errors surface as `grpc.aio.AioRpcError` / `grpc.RpcError` with the server's status and message.

Against a server started with TLS / `--api-key` (docs/OPERATIONS.md):

    AsyncClient(target, root_certificates=open("ca.pem", "rb").read(),   # TLS
                private_key=..., certificate_chain=...,                  # mutual TLS
                api_key="KEY")                                           # authorization metadata
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from doppelchip.v1 import inference_pb2 as pb
from doppelchip.v1 import inference_pb2_grpc as pb_grpc

DEFAULT_TARGET = "127.0.0.1:50051"

_SAMPLING_FIELDS = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields}


def build_request(
    prompt: str | Sequence[int],
    *,
    deployment: str = "",
    model: str = "",
    request_id: str = "",
    priority: int = 0,
    return_token_times: bool = False,
    return_prompt_token_ids: bool = False,
    regex: str | None = None,
    json_schema: str | Mapping[str, Any] | None = None,
    choice: Sequence[str] | None = None,
    grammar: str | None = None,
    **sampling: Any,
) -> pb.GenerateRequest:
    """A GenerateRequest; keyword arguments named after SamplingParams fields set them.

    Structured output: at most one of `regex`, `json_schema` (a JSON Schema, as text or a
    dict), `choice` (the output is exactly one of these strings) or `grammar` (Lark/GBNF)."""
    unknown = set(sampling) - _SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
    given = {k: v for k, v in (("regex", regex), ("json_schema", json_schema),
                               ("choice", choice), ("grammar", grammar)) if v is not None}
    if len(given) > 1:
        raise TypeError(f"at most one constraint, got {', '.join(given)}")
    req = pb.GenerateRequest(
        request_id=request_id,
        deployment=deployment,
        model=model,
        priority=priority,
        return_token_times=return_token_times,
        return_prompt_token_ids=return_prompt_token_ids,
        sampling=pb.SamplingParams(**{k: v for k, v in sampling.items() if v is not None}),
    )
    if isinstance(prompt, str):
        req.text = prompt
    else:
        req.token_ids.ids.extend(prompt)
    for kind, value in given.items():
        if kind == "choice":
            req.constraint.choice.SetInParent()  # present even when the list is empty
            req.constraint.choice.choices.extend(value)
        elif kind == "json_schema" and not isinstance(value, str):
            req.constraint.json_schema = json.dumps(value)
        else:
            setattr(req.constraint, kind, value)
    return req


@dataclass(frozen=True)
class Security:
    """How a client connects: TLS when `tls` or any certificate is given (the system's roots
    unless `root_certificates`), a client certificate for mutual TLS, and the API key sent as
    `authorization: Bearer KEY` on every call."""

    tls: bool = False
    root_certificates: bytes | None = None  # PEM of the CA the server's certificate chains to
    private_key: bytes | None = None  # PEM, with certificate_chain: mutual TLS
    certificate_chain: bytes | None = None
    api_key: str | None = None

    @property
    def secure(self) -> bool:
        return self.tls or any((self.root_certificates, self.private_key,
                                self.certificate_chain))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key,
                                            self.certificate_chain)

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else None


class AsyncClient:
    def __init__(self, target: str = DEFAULT_TARGET, **security: Any) -> None:
        """`security`: the fields of `Security` (tls, root_certificates, private_key,
        certificate_chain, api_key)."""
        self.target, self.security = target, Security(**security)
        self.metadata = self.security.metadata()
        self.channel = (grpc.aio.secure_channel(target, self.security.credentials())
                        if self.security.secure else grpc.aio.insecure_channel(target))
        self.stub = pb_grpc.InferenceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def generate(
        self, prompt: str | Sequence[int], *, timeout: float | None = None, **kwargs: Any
    ) -> AsyncIterator[pb.GenerateResponse]:
        """Stream the response chunks; the last one has `final` set."""
        call = self.stub.Generate(build_request(prompt, **kwargs), timeout=timeout,
                                  metadata=self.metadata)
        try:
            async for chunk in call:
                yield chunk
        finally:
            call.cancel()  # no-op when finished; frees the request when the caller stops early

    async def list_deployments(self, timeout: float | None = 10) -> pb.ListDeploymentsResponse:
        return await self.stub.ListDeployments(pb.ListDeploymentsRequest(), timeout=timeout,
                                               metadata=self.metadata)

    async def get_deployment(self, name: str, timeout: float | None = 10) -> pb.Deployment:
        return await self.stub.GetDeployment(pb.GetDeploymentRequest(name=name), timeout=timeout,
                                             metadata=self.metadata)

    async def health(self, service: str = "", timeout: float | None = 10) -> int:
        """The health status enum value (health_pb2.HealthCheckResponse.SERVING, ...)."""
        req = health_pb2.HealthCheckRequest(service=service)
        return (await self.health_stub.Check(req, timeout=timeout)).status


class Client:
    """The synchronous twin of AsyncClient."""

    def __init__(self, target: str = DEFAULT_TARGET, **security: Any) -> None:
        self.target, self.security = target, Security(**security)
        self.metadata = self.security.metadata()
        self.channel = (grpc.secure_channel(target, self.security.credentials())
                        if self.security.secure else grpc.insecure_channel(target))
        self.stub = pb_grpc.InferenceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def generate(
        self, prompt: str | Sequence[int], *, timeout: float | None = None, **kwargs: Any
    ) -> Iterator[pb.GenerateResponse]:
        call = self.stub.Generate(build_request(prompt, **kwargs), timeout=timeout,
                                  metadata=self.metadata)
        try:
            yield from call
        finally:
            call.cancel()

    def list_deployments(self, timeout: float | None = 10) -> pb.ListDeploymentsResponse:
        return self.stub.ListDeployments(pb.ListDeploymentsRequest(), timeout=timeout,
                                         metadata=self.metadata)

    def get_deployment(self, name: str, timeout: float | None = 10) -> pb.Deployment:
        return self.stub.GetDeployment(pb.GetDeploymentRequest(name=name), timeout=timeout,
                                       metadata=self.metadata)

    def health(self, service: str = "", timeout: float | None = 10) -> int:
        req = health_pb2.HealthCheckRequest(service=service)
        return self.health_stub.Check(req, timeout=timeout).status
