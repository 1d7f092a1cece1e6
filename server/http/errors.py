"""HTTP errors in vLLM's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

`code` is the HTTP status as an integer. `type` follows vLLM 0.33.0
(`vllm/entrypoints/serve/exception_handling/error_response.py`): `BadRequestError` for a bad
parameter, `NotFoundError` for an unknown model, the HTTP phrase (`"Bad Request"`,
`"Service Unavailable"`, `"Too Many Requests"`) for framework-level and graceful errors, and
`InternalServerError` for a request the engine could not finish. One deliberate difference:
admission-control overload answers **429** (issue 12), where vLLM 0.33.0 answers 503.
"""

from __future__ import annotations

from http import HTTPStatus

import msgspec
from starlette.responses import Response

from server.engine.interface import (
    AlreadyExists,
    EngineError,
    InvalidRequest,
    NotPlaced,
    Overloaded,
    Unavailable,
)
from server.fleet import UnknownDeployment
from server.frontend import request_ids
from server.frontend.faults import InjectedFailure


class HttpError(Exception):
    """An error answer: status, message, vLLM's `type` and the offending `param`."""

    def __init__(self, status: int, message: str, type_: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type = type_ or HTTPStatus(status).phrase

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}

    def json(self) -> bytes:
        return msgspec.json.encode(self.body())


def bad_request(message: str, param: str | None = None) -> HttpError:
    return HttpError(400, message, "BadRequestError", param)


def unknown_model(model: str, names: list[str]) -> HttpError:
    return HttpError(404, f"The model `{model}` does not exist. Valid aliases: "
                          f"{', '.join(names)}.", "NotFoundError", "model")


def draining() -> HttpError:
    return HttpError(503, "The server is draining: it takes no new requests.")


def from_engine(e: EngineError | UnknownDeployment) -> HttpError:
    """The HTTP answer to an admission error (nothing was allocated for the request)."""
    if isinstance(e, InjectedFailure):  # failure injection (issue 13): llm-d-sim's answer
        return HttpError(e.http_status, str(e), e.error_type, e.kind.param)
    if isinstance(e, InvalidRequest):
        return bad_request(str(e), _param_of(str(e)))
    if isinstance(e, AlreadyExists):
        return HttpError(409, str(e), "ConflictError", "request_id")
    if isinstance(e, Overloaded):
        return HttpError(429, str(e))
    if isinstance(e, Unavailable):
        return HttpError(503, str(e))
    if isinstance(e, NotPlaced):
        return HttpError(503, str(e))
    if isinstance(e, UnknownDeployment):
        return HttpError(404, str(e), "NotFoundError", "model")
    return HttpError(500, str(e), "InternalServerError")


def engine_failed(message: str) -> HttpError:
    """The engine process died under the request (vLLM: EngineDeadError → 500)."""
    return HttpError(500, message, "InternalServerError")


_PARAMS = ("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p",
           "repetition_penalty", "presence_penalty", "frequency_penalty", "stop")


def _param_of(message: str) -> str | None:
    """The request field an engine validation message is about (vLLM sets `param`)."""
    for name in _PARAMS:
        if message.startswith(name):
            return name
    if message.startswith(("prompt", "token id", "request needs")):
        return "prompt"
    return None


def error_response(e: HttpError, request_id: str | None = None) -> Response:
    """The JSON error answer (with `X-Request-Id` when the request has one)."""
    headers = {"X-Request-Id": request_ids.metadata_value(request_id)} if request_id else None
    return Response(e.json(), status_code=e.status, media_type="application/json",
                    headers=headers)


# pydantic's union-branch and wrapper markers in an error's `loc`, which vLLM leaves out of
# `param` (`clean_loc_for_param`, vllm/entrypoints/serve/exception_handling/handlers/).
_MARKERS = frozenset({"function-wrap", "function-after", "function-before", "function-plain",
                      "json-or-python", "lax-or-strict", "chain", "default", "nullable",
                      "tagged-union", "union", "str", "int", "float", "bool", "bytes", "list",
                      "tuple", "dict", "set", "none"})


def validation_error(errors: list) -> HttpError:
    """A pydantic error list as vLLM's 400 (`param`: the field's path, `body.<field>`)."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ())
           if not any(c in str(p) for c in "[](){}") and str(p).lower() not in _MARKERS]
    param = ".".join(["body", *loc]) if loc and loc[0] != "body" else ".".join(loc) or None
    count = len(errors)
    message = (f"{count} validation error{'s' if count != 1 else ''}: "
               f"{param or 'body'}: {first.get('msg', 'invalid')}")
    return HttpError(400, message, param=param)
