"""A POST route's JSON body read as vLLM 0.33.0's FastAPI routes read theirs.

vLLM declares each body as a pydantic model parameter and adds `Depends(validate_json_request)`
(`vllm/entrypoints/serve/utils/api_utils.py`) to every POST route that takes JSON:
/v1/completions, /v1/chat/completions, /tokenize, /detokenize, /v1/load_lora_adapter,
/v1/unload_lora_adapter (and routes doppelchip does not have). FastAPI then works in this order:

1. the body is read; when its Content-Type is `application/json` or `application/*+json` and
   it is not empty, it is decoded with `json.loads`: bad JSON is a RequestValidationError
   `json_invalid` located at `("body", <character position>)`; bytes that are not text, or
   JSON nested too deep for `json.loads`, are a 400 "There was an error parsing the body";
2. the dependency: a media type (before any `;`, lower-cased) other than `application/json` —
   no Content-Type included — is a RequestValidationError "Unsupported Media Type: Only
   'application/json' is allowed";
3. the body is validated against the model (an empty body is a missing `body`); the model's
   own checks (`mode="before"` validators) run first and may raise a vLLM error.

Every RequestValidationError is answered as vLLM's handler answers it (`validation_error`).
"""

from __future__ import annotations

import email.message
import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request

from server.http.errors import HttpError, body_errors, validation_error

M = TypeVar("M", bound=BaseModel)
UNSUPPORTED_MEDIA = "Unsupported Media Type: Only 'application/json' is allowed"


def _decodes_json(content_type: str) -> bool:
    """Whether FastAPI decodes a body of this Content-Type as JSON."""
    if not content_type:
        return False  # FastAPI's strict_content_type (its default): no type, no decoding
    header = email.message.Message()
    header["content-type"] = content_type
    sub = header.get_content_subtype()
    return header.get_content_maintype() == "application" and (
        sub == "json" or sub.endswith("+json"))


def _decoded(raw: bytes) -> Any:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise validation_error([{"type": "json_invalid", "loc": ("body", e.pos),
                                 "msg": "JSON decode error", "input": {},
                                 "ctx": {"error": e.msg}}]) from None
    except Exception:  # not UTF-8 (or -16/-32) text, nested too deep: FastAPI's answer
        raise HttpError(400, "There was an error parsing the body") from None
    unicode_checked(raw, data)
    return data


# what a lone surrogate looks like in a body's bytes: an escaped one (a pair matches too: the
# decoded strings are then checked), its own three bytes, or a body that is not UTF-8 at all
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def unicode_checked(raw: bytes, data: Any) -> None:
    """A 400 if a string of the decoded body (a key included) holds a lone surrogate: JSON lets
    one through (an escaped `\\ud800`, or the bytes of one, which `json.loads` accepts), no
    tokenizer, grammar compiler or encoder takes it, and FastAPI would pass it on (vLLM then
    fails wherever it lands). The strings are walked only when the bytes may hold one."""
    if not (_MAYBE_SURROGATE.search(raw) or b"\x00" in raw[:4]):
        return
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode()
                except UnicodeEncodeError as e:
                    raise HttpError(400, "There was an error parsing the body: a string holds "
                                    f"a lone surrogate (U+{ord(v[e.start]):04X}), which is not "
                                    "Unicode text") from None
        elif isinstance(v, dict):
            stack += v.keys()
            stack += v.values()
        elif isinstance(v, list):
            stack += v


def media_type_ok(content_type: str) -> bool:
    """vLLM's `validate_json_request` test."""
    return content_type.lower().split(";", maxsplit=1)[0] == "application/json"


async def parse_json(request: Request, model: type[M] | TypeAdapter) -> M:
    """The request's body as `model`, or the error vLLM answers for it."""
    raw = await request.body()
    content_type = request.headers.get("content-type", "")
    data = _decoded(raw) if raw and _decodes_json(content_type) else None
    if not media_type_ok(content_type):
        raise validation_error([UNSUPPORTED_MEDIA])
    if not raw:
        raise validation_error([{"type": "missing", "loc": ("body",), "msg": "Field required",
                                 "input": None}])
    return validated(model, data)


def validated(model: type[M] | TypeAdapter, data: object) -> M:
    """Decoded JSON as `model` (a model, or a TypeAdapter of a union of them), or vLLM's
    validation error for it, located in the body."""
    try:
        validate = model.validate_python if isinstance(model, TypeAdapter) else \
            model.model_validate
        return validate(data)
    except ValidationError as e:
        raise validation_error(body_errors(e.errors(include_url=False))) from None
