"""vLLM's runtime LoRA routes and the adapters' model cards (issue 13, docs/LORA.md).

`POST /v1/load_lora_adapter` `{"lora_name", "lora_path"}` and `POST /v1/unload_lora_adapter`
`{"lora_name"}` as vLLM's `OpenAIServingModels` answers them: 200 with the plain-text success
message; 400 `InvalidUserInput` for a missing field or a duplicate name; 404 `NotFoundError`
for unloading an unknown adapter. Always available (vLLM needs
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`; accepted here, not required). doppelchip's additions to
the body, all optional: `rank` (the adapter's rank; no adapter_config.json is read) and
`deployment` (which deployment, in fleet mode; default: the default deployment).
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import Response

from server.fleet import UnknownDeployment
from server.frontend.deployment import DeploymentClient
from server.http.body import parse_json
from server.http.errors import HttpError, error_response
from server.http.models import model_card
from server.http.state import HttpState


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # vLLM's OpenAIBaseModel accepts extra fields
    lora_name: str
    lora_path: str
    load_inplace: bool = False
    rank: int | None = None
    deployment: str | None = None


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    lora_name: str
    lora_int_id: int | None = None
    deployment: str | None = None


def _deployment(state: HttpState, name: str | None) -> DeploymentClient:
    try:
        return state.fleet.get(name or state.fleet.default_name)
    except UnknownDeployment as e:
        raise HttpError(404, str(e), "NotFoundError", "deployment") from None


async def _answer(client: DeploymentClient, kind: str, **fields) -> Response:
    if not client.lora.enabled:
        raise HttpError(400, f"LoRA is not enabled on deployment {client.name!r} "
                             "(--enable-lora)", "BadRequestError")
    answer = await client.lora.op(client.sockets, kind, **fields)
    if answer.status != 200:
        raise HttpError(answer.status, answer.message, answer.kind)
    return Response(answer.message, status_code=200)


async def parse(request: Request, model: type[BaseModel]):
    """The body, or vLLM's 400 for a malformed one (as `routes.parse`)."""
    return await parse_json(request, model)


def add_lora_routes(app: FastAPI, state: HttpState) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await parse(request, LoadLoRAAdapterRequest)
        try:
            if not body.lora_name or not body.lora_path:
                raise HttpError(400, "Both 'lora_name' and 'lora_path' must be provided.",
                                "InvalidUserInput")
            client = _deployment(state, body.deployment)
            if body.lora_name in state.fleet.models:
                raise HttpError(400, f"'{body.lora_name}' is a base model's name",
                                "InvalidUserInput")
            return await _answer(client, "load", name=body.lora_name, path=body.lora_path,
                                 rank=body.rank)
        except HttpError as e:
            return error_response(e, None)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body = await parse(request, UnloadLoRAAdapterRequest)
        try:
            if not body.lora_name:
                raise HttpError(400, "'lora_name' needs to be provided to unload a LoRA "
                                     "adapter.", "InvalidUserInput")
            client = _deployment(state, body.deployment)
            return await _answer(client, "unload", name=body.lora_name)
        except HttpError as e:
            return error_response(e, None)


def model_cards(state: HttpState, created: int) -> list[dict]:
    """One card per adapter, after the base models' (vLLM: root = the adapter's path, parent =
    its base model's name, else the deployment's first served name)."""
    cards = []
    for client in state.fleet.clients.values():
        for a in client.lora.adapters():
            cards.append(model_card(a.name, a.path,
                                    a.base_model_name or client.info.model_name, None, created))
    return cards
