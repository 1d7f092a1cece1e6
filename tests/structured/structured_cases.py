"""Constraints the structured-output tests share: regexes, JSON schemas, choices, and an
engine core to drive without a server."""

from __future__ import annotations

import json
from dataclasses import dataclass

from clients.structured import ORDER_SCHEMA
from server.engine.build import build_core
from server.engine.core import EngineCore
from server.engine.interface import Constraint
from server.engine.options import EngineOptions
from server.engine.request import Request, SamplingParams
from server.engine.tokenizer import get_tokenizer

REGEXES = [
    r"[0-9]{3}-[0-9]{4}",
    r"[a-z]+@[a-z]+\.(com|org)",
    r"(yes|no|maybe)",
    r"(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?",
    r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8}){0,2}",
]

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 10},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "address": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 12},
                                       "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "age", "address"],
                "additionalProperties": False,
            },
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                     "minItems": 1, "maxItems": 4},
            "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        },
        "required": ["tags", "scores"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["small", "medium", "large"]},
            "count": {"enum": [1, 2, 3]},
            "ok": {"type": "boolean"},
        },
        "required": ["colour", "size", "count", "ok"],
        "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "note": {"type": "string", "maxLength": 8},
                       "flag": {"type": "boolean"}},
        "required": ["id"],
    },
    "order": ORDER_SCHEMA,
}

CHOICES = [("positive", "negative", "neutral"), ("A", "B"), ("only one",), ("café", "thé")]


def core(engine: str = "sglang", **options: object) -> EngineCore:
    return build_core(EngineOptions(name="t", model="llama-3.1-8b", quant="bf16",
                                    chip="h100-sxm", engine=engine, **options))  # type: ignore[arg-type]


@dataclass
class Run:
    """One request driven alone through a core: the request, its steps, emulated seconds."""

    request: Request
    steps: int = 0
    decode_steps: int = 0  # steps that computed exactly one new token (a plain decode)
    seconds: float = 0.0

    @property
    def text(self) -> str:
        return get_tokenizer().decode(self.request.output_token_ids)


def run_one(eng: EngineCore, constraint: Constraint, *, seed: int = 0, max_tokens: int = 200,
            prompt: str = "Answer:") -> Run:
    """One constrained request through `eng` alone, stepped to completion."""
    req = Request(f"r{seed}", get_tokenizer().encode(prompt),
                  SamplingParams(max_tokens=max_tokens, seed=seed))
    req.constraint = eng.constraints.start(constraint, 65536)
    eng.add_request(req)
    run = Run(req)
    while eng.has_unfinished():
        result = eng.step()
        assert result is not None
        run.steps += 1
        run.decode_steps += result.output.num_decode_tokens
        run.seconds += result.seconds
    return run


def schema_constraint(schema: dict) -> Constraint:
    return Constraint("json_schema", json.dumps(schema))
