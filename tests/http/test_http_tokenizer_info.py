"""vLLM's `GET /tokenizer_info` (`--enable-tokenizer-info-endpoint`) on a real pod: the
configuration of the tokenizer the pod runs, enough for a client to tokenize and render chats
as the pod does — checked by rebuilding that tokenizer from the answer and the vocabulary
alone and comparing it with the pod's own /tokenize."""

from __future__ import annotations

import json

import httpx
import jinja2
import pytest
import tokenizers
from server_proc import ServerProcess

from server.engine.tokenizer import TOKENIZER_DIR

MODEL = "llama-3.1-8b"
POD = ["--chip", "h100-sxm", "--engine", "vllm", "--model", MODEL, "--quant", "fp8",
       "--max-model-len", "1024", "--enable-tokenizer-info-endpoint"]


@pytest.fixture(scope="module")
def info():
    with ServerProcess(None, *POD) as s, httpx.Client(base_url=s.http_url) as http:
        r = http.get("/tokenizer_info")
        assert r.status_code == 200
        messages = [{"role": "user", "content": "Hello there, how are you?"}]
        served = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
        yield r.json(), messages, served["tokens"]


def test_it_is_the_tokenizer_config_as_vllm_answers_it(info):
    got, _, _ = info
    shipped = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert got["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (got["bos_token"], got["eos_token"]) == (shipped["bos_token"], shipped["eos_token"])
    assert got["added_tokens_decoder"]["0"] == "<|begin_of_text|>"  # a token as its content
    assert got["model_max_length"] == shipped["model_max_length"]
    assert "doppelchip_training" not in got and "vocab_file" not in got


def test_a_client_renders_and_tokenizes_as_the_pod_does(info):
    got, messages, served = info
    text = jinja2.Environment().from_string(got["chat_template"]).render(
        messages=messages, bos_token=got["bos_token"], add_generation_prompt=True)
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    assert tok.encode(text, add_special_tokens=False).ids == served
