"""HTTP errors in vLLM's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

`code` is the HTTP status as an integer. `type` follows vLLM 0.33.0
(`vllm/entrypoints/serve/exception_handling/error_response.py`): `BadRequestError` for a bad
parameter, `NotFoundError` for an unknown model, the HTTP phrase (`"Bad Request"`,
`"Service Unavailable"`, `"Too Many Requests"`) for framework-level and graceful errors, and
`InternalServerError` for a request the engine could not finish. One deliberate difference:
admission-control overload answers **429** (issue 12), where vLLM 0.33.0 answers 503.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from http import HTTPStatus

import msgspec
from starlette.responses import Response

from server.engine.errors import (
    AlreadyExists,
    EngineError,
    InvalidRequest,
    NotPlaced,
    Overloaded,
    Paused,
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
    if isinstance(e, Paused):  # vLLM's RetryableRequestError
        return HttpError(503, str(e), "ServiceUnavailableError")
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


def error_response(e: HttpError, request_id: str | None = None,
                   body: Callable[[HttpError], dict] = HttpError.body) -> Response:
    """The JSON error answer (with `X-Request-Id` when the request has one); `body` writes it
    (the Messages API has its own: `server.http.messages.error_body`)."""
    headers = {"X-Request-Id": request_ids.metadata_value(request_id)} if request_id else None
    return Response(msgspec.json.encode(body(e)), status_code=e.status,
                    media_type="application/json", headers=headers)


# pydantic's union-branch and wrapper markers in an error's `loc`, which vLLM leaves out of
# `param` and of the message (`clean_loc_for_param`, vllm/entrypoints/serve/exception_handling/
# handlers/validation.py); a segment with brackets or parentheses is one too.
_MARKERS = frozenset({"function-wrap", "function-after", "function-before", "function-plain",
                      "json-or-python", "lax-or-strict", "chain", "default", "nullable",
                      "tagged-union", "union", "call", "arguments", "is-instance",
                      "is-subclass", "callable", "str", "int", "float", "bool", "bytes",
                      "bytearray", "list", "tuple", "dict", "set", "frozenset", "complex",
                      "none", "nonetype"})
MAX_LISTED, MAX_INPUT, MAX_ENTRY = 10, 200, 1000  # vLLM's bounds on the message's size


def _marker(segment: str) -> bool:
    return any(c in segment for c in "[](){}") or segment.lower() in _MARKERS


def clean_loc(loc: Sequence[object]) -> str:
    """An error location as vLLM's `param`: `("body", "union[…]", "prompt")` → "body.prompt"
    (every segment when all are markers)."""
    parts = [str(p) for p in loc if not _marker(str(p))]
    return ".".join(parts or [str(p) for p in loc])


def _summary(value: object) -> str:
    """The bounded stand-in vLLM shows for an error's `input`."""
    if isinstance(value, bytes | bytearray):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # e.g. an int too long for str()
        return f"<{type(value).__name__}>"
    return text[:MAX_INPUT] + "...[truncated]" if len(text) > MAX_INPUT else text


def _entry(error: object) -> str:
    if isinstance(error, dict):
        error = dict(error)
        if "input" in error:
            error["input"] = _summary(error["input"])
        if isinstance(error.get("loc"), tuple | list):
            error["loc"] = clean_loc(error["loc"])
    text = str(error)
    return text[:MAX_ENTRY] + "...[truncated]" if len(text) > MAX_ENTRY else text


_SCRUB = ((re.compile(r" at 0x[0-9a-fA-F]+>"), ">"),
          (re.compile(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?'), ""),
          (re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+"), "<path>"),
          (re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+"), "<path>"))


def scrub(message: str) -> str:
    """vLLM's `sanitize_message`: no object addresses, traceback lines or file paths."""
    for pattern, replacement in _SCRUB:
        message = pattern.sub(replacement, message)
    return message.strip()


def validation_error(errors: Sequence[object]) -> HttpError:
    """A request that fails validation, as vLLM's RequestValidationError handler answers it:
    400 `Bad Request`, every error listed (up to ten) with its location cleaned, `param` the
    first error's location (`body.<field>`). `errors`: pydantic's error dicts with their full
    location, or plain strings (the media-type check's)."""
    if not errors:
        return HttpError(400, "Validation error")
    first = errors[0]
    loc = first.get("loc") if isinstance(first, dict) else None
    count = len(errors)
    label = "error" if count == 1 else "errors"
    lines = [f"{count} validation {label}:", *(f"  {_entry(e)}" for e in errors[:MAX_LISTED])]
    if count > MAX_LISTED:
        lines.append(f"  ...and {count - MAX_LISTED} more {label}")
    return HttpError(400, scrub("\n".join(lines)), param=clean_loc(loc) if loc else None)


def body_errors(errors: Sequence[dict]) -> list[dict]:
    """A request model's pydantic errors located as FastAPI locates a body's: under `body`."""
    return [{**e, "loc": ("body", *e.get("loc", ()))} for e in errors]


def vllm_invalid(message: str, parameter: str | None = None, value: object = None) -> HttpError:
    """vLLM's `VLLMValidationError` as its handler answers it: 400 `BadRequestError`, the
    message as the exception's `str` — followed by `(parameter=…, value=…)` for what is set."""
    extras = [f"{k}={v}" for k, v in (("parameter", parameter), ("value", value))
              if v is not None]
    text = f"{message} ({', '.join(extras)})" if extras else message
    return HttpError(400, scrub(text), "BadRequestError", parameter)
