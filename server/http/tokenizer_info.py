"""vLLM's `GET /tokenizer_info`, mounted as vLLM 0.33.0 mounts it: only with
`--enable-tokenizer-info-endpoint` (`vllm/entrypoints/serve/tokenize/api_router.py`; the answer
from `serving.py` `TokenizerInfo`): the tokenizer's configuration, what its
`tokenizer_config.json` holds, for a router or client that tokenizes as the pod does.

As vLLM builds it from the tokenizer's `init_kwargs`: the file paths (`vocab_file`,
`merges_file`) left out, an added token written as its content (`added_tokens_decoder` maps an
id to the token's text), `tokenizer_class` and the chat template the server renders with.
doppelchip's own provenance (`doppelchip_training`) is not part of a tokenizer's config and is
left out too. `tokenizer_class` is the class the configuration names (`PreTrainedTokenizerFast`,
what `transformers` loads it with); vLLM names its wrapper class there.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.responses import JSONResponse

from server.engine.tokenizer import Tokenizer
from server.http.state import HttpState

LEFT_OUT = ("vocab_file", "merges_file", "doppelchip_training")


def tokenizer_info(tok: Tokenizer) -> dict[str, Any]:
    config = {k: v for k, v in tok.config.items() if k not in LEFT_OUT}
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        config["added_tokens_decoder"] = {
            k: v.get("content", v) if isinstance(v, dict) else v for k, v in decoder.items()}
    config["tokenizer_class"] = tok.config.get("tokenizer_class", "PreTrainedTokenizerFast")
    if tok.chat_template:
        config["chat_template"] = tok.chat_template
    return config


def add_tokenizer_info_route(app: FastAPI, state: HttpState) -> None:
    @app.get("/tokenizer_info")
    async def get_tokenizer_info() -> JSONResponse:
        return JSONResponse(tokenizer_info(state.tokenizer))
