"""The packaged byte-level BPE: round trips, streaming detokenization, chat template."""

from __future__ import annotations

import json
import random

import pytest

from server.engine.tokenizer import TOKENIZER_DIR, Tokenizer, get_tokenizer

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "def f(x):\n    return x ** 2  # squares\n\ttabbed\r\n",
    "héllo wörld — naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji: 🤖🎉👍🏽 family 👨‍👩‍👧 flags 🇯🇵 e\u0301 (combining)",
    "",
    " leading and trailing spaces  ",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return get_tokenizer()


def test_shipped_files_and_special_tokens(tok: Tokenizer) -> None:
    assert (TOKENIZER_DIR / "tokenizer.json").stat().st_size < 1_500_000
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert "chat_template" in config and config["eos_token"] == tok.eos_token
    assert 8000 <= tok.vocab_size <= 16384
    assert tok.eos_token_id in tok.special_token_ids and tok.bos_token_id in tok.special_token_ids
    assert len(tok.normal_token_ids) == tok.vocab_size - len(tok.special_token_ids)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_common_english_is_compressed(tok: Tokenizer) -> None:
    text = "The function returns a new list containing the values of the object."
    assert len(tok.encode(text)) < len(text) / 3


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_equals_full_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    detok = tok.detokenizer()
    deltas = [detok.push(i) for i in ids]
    assert "".join(deltas) + detok.flush() == text
    assert all("\ufffd" not in d for d in deltas)  # split characters are held back


def test_multibyte_character_split_across_tokens(tok: Tokenizer) -> None:
    # An emoji's 4 bytes spread over several byte-level tokens: no delta until it completes.
    ids = tok.encode("🦜")
    assert len(ids) > 1
    detok = tok.detokenizer()
    assert [detok.push(i) for i in ids][:-1] == [""] * (len(ids) - 1)


def test_incremental_equals_full_decode_on_random_ids(tok: Tokenizer) -> None:
    rng = random.Random(0)
    ids = [rng.choice(tok.normal_token_ids) for _ in range(3000)]
    ids[100:100] = [tok.eos_token_id, tok.bos_token_id]  # special tokens are skipped
    detok = tok.detokenizer()
    text = "".join(detok.push(i) for i in ids[:1500]) + detok.push_many(ids[1500:])
    assert text + detok.flush() == tok.decode(ids)


def test_chat_template(tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi! "}]
    text = tok.apply_chat_template(messages)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tok.encode_chat(messages)
    assert ids[0] == tok.bos_token_id and tok.eos_token_id in ids
    assert tok.decode(ids) == "system\n\nBe brief.user\n\nHi!assistant\n\n"


def test_chat_template_matches_jinja_when_available(tok: Tokenizer) -> None:
    jinja2 = pytest.importorskip("jinja2")
    messages = [{"role": "user", "content": "  Hello  "}]
    env = jinja2.Environment()
    rendered = env.from_string(tok.chat_template).render(
        messages=messages, bos_token=tok.bos_token, add_generation_prompt=True
    )
    assert rendered == tok.apply_chat_template(messages)
