"""The packaged Llama-3-style BPE: lengths like Llama 3's, round trips, whole-character
generated tokens, streaming detokenization, chat template, Hugging Face loading, training."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from server.engine.mock_model import MockModel
from server.engine.tokenizer import TOKENIZER_DIR, Tokenizer, get_tokenizer

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "scripts" / "corpus"

# Llama 3's token counts of the held-out public-domain texts (neither is in the training
# corpus), computed once with the npm package llama3-tokenizer-js 1.2.0 (Meta's Llama 3 / 3.1
# vocabulary and merges; https://github.com/belladoreai/llama3-tokenizer-js) on Node 20.20.2:
#   npm install llama3-tokenizer-js@1.2.0     # in a scratch folder outside the repository
#   node -e 'import("llama3-tokenizer-js").then(({default: t}) => console.log(t.encode(
#     require("fs").readFileSync(process.argv[1], "utf8"), {bos: false, eos: false}).length))' F
# Keyed by path, with the sha256 of the text the count belongs to. Measured ratios (ours /
# Llama 3) when the tokenizer was trained: Persuasion 0.988, The Devil's Dictionary 1.065.
LLAMA3_TOKENS = {
    "heldout/austen-persuasion.txt":
        ("8061549557aebd2fd6e353d18d9197cb707029112bd52d4d8b174583a925848a", 111_665),
    "heldout/devils-dictionary.txt":
        ("1a2f468e8d52383945467c975eb97524995bfd976082e9e6cb52f182521a6ba9", 92_396),
}
TOLERANCE = 0.15

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "def f(x):\n    return x ** 2  # squares\n\ttabbed\r\n",
    "héllo wörld — naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji: 🤖🎉👍🏽 family 👨‍👩‍👧 flags 🇯🇵 e\u0301 (combining)",
    "",
    " leading and trailing spaces  ",
    "I'm sure you'll say it's THE best, we'd've known... 3.14159 or 1,000,000?",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return get_tokenizer()


def test_shipped_files_and_special_tokens(tok: Tokenizer) -> None:
    assert (TOKENIZER_DIR / "tokenizer.json").stat().st_size <= 4_000_000
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "chat_template" in config and config["eos_token"] == tok.eos_token
    special_map = json.loads((TOKENIZER_DIR / "special_tokens_map.json").read_text())
    assert special_map["bos_token"] == tok.bos_token == "<|begin_of_text|>"
    assert tok.vocab_size == config["doppelchip_training"]["vocab_size"] == 32768
    assert tok.special_token_ids == {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id,
                                     *(tok._id(t) for t in config["additional_special_tokens"])}
    assert len(tok.special_token_ids) == 6


@pytest.mark.parametrize("name", sorted(LLAMA3_TOKENS))
def test_length_within_15_percent_of_llama3(tok: Tokenizer, name: str) -> None:
    digest, llama3 = LLAMA3_TOKENS[name]
    data = (CORPUS / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest, "the text is not the one Llama 3 counted"
    ours = len(tok.encode(data.decode("utf-8")))
    ratio = ours / llama3
    assert abs(ratio - 1) <= TOLERANCE, f"{name}: {ours} tokens, Llama 3 {llama3}: {ratio:.3f}"


def test_held_out_texts_are_not_in_the_training_corpus() -> None:
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    trained = config["doppelchip_training"]["corpus"]
    assert trained and not any(Path(p).name in {Path(n).name for n in LLAMA3_TOKENS}
                               for p in trained)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_round_trip_on_a_held_out_text(tok: Tokenizer) -> None:
    text = (CORPUS / "heldout" / "devils-dictionary.txt").read_text()[:50_000]
    assert tok.decode(tok.encode(text)) == text


def test_special_token_text_in_a_prompt_is_its_id(tok: Tokenizer) -> None:
    # As Llama 3's tokenizer: a special token's text in the input is the special token.
    assert tok.encode("a<|eot_id|>") == [*tok.encode("a"), tok.eos_token_id]


def test_common_english_is_compressed(tok: Tokenizer) -> None:
    text = "The function returns a new list containing the values of the object."
    assert len(tok.encode(text)) < len(text) / 4


def test_generated_tokens_are_whole_characters(tok: Tokenizer) -> None:
    """What the mock model emits decodes alone (no U+FFFD for a token-at-a-time client); the
    excluded ids are exactly the special tokens and the UTF-8 fragments."""
    normal = set(tok.normal_token_ids)
    fragments = set()
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i)
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            fragments.add(i)
    assert len(fragments) >= 128  # every lone byte >= 0x80 is a token: the filter matters
    assert normal == set(range(tok.vocab_size)) - tok.special_token_ids - fragments
    model = MockModel.from_tokenizer(tok)
    assert set(model.vocab_ids) <= normal
    assert all("\ufffd" not in tok.decode([i]) and tok.decode([i]) for i in model.vocab_ids)


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


def test_client_sent_byte_tokens_hold_back_partial_characters(tok: Tokenizer) -> None:
    """Ids a client sends may split every character into single-byte tokens: each delta is the
    text completed so far, never a fragment."""
    byte_id = {tok.token_bytes(i): i for i in range(tok.vocab_size)
               if len(tok.token_bytes(i)) == 1}
    text = TEXTS[3] + TEXTS[4]
    data = text.encode()
    detok, shown, held = tok.detokenizer(), "", 0
    for n, b in enumerate(data, 1):
        delta = detok.push(byte_id[bytes([b])])
        assert "\ufffd" not in delta
        held += delta == ""
        shown += delta
        assert shown == data[:n].decode("utf-8", errors="ignore")  # the whole characters
    assert held == len(data) - len(text)  # one silent push per continuation byte
    assert shown + detok.flush() == text


def test_incremental_equals_full_decode_on_random_ids(tok: Tokenizer) -> None:
    rng = random.Random(0)
    ids = [rng.randrange(tok.vocab_size) for _ in range(3000)]  # fragments and specials too
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


# Run in a fresh process, as a load tool does (AIPerf's --tokenizer PATH): offline, from the
# directory alone.
_HF_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
hf = AutoTokenizer.from_pretrained(sys.argv[1])
texts, messages = json.loads(sys.stdin.read())
print(json.dumps({
    "plain": [hf.encode(t, add_special_tokens=False) for t in texts],
    "default": hf(texts[0])["input_ids"],
    "decoded": [hf.decode(hf.encode(t, add_special_tokens=False)) for t in texts],
    "chat_text": hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
    "chat_ids": list(hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                            return_dict=True)["input_ids"]),
    "special": [hf.bos_token_id, hf.eos_token_id, hf.pad_token_id, len(hf)],
}))
"""


def test_transformers_loads_the_directory_offline_with_our_ids(tok: Tokenizer) -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers (the dev extra) is not installed")
    texts = [*TEXTS[:5], (CORPUS / "heldout" / "austen-persuasion.txt").read_text()[:20_000]]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "}]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _HF_SCRIPT, str(TOKENIZER_DIR)],
                          input=json.dumps([texts, messages]), capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["plain"] == [tok.encode(t) for t in texts]
    assert got["default"] == [tok.bos_token_id, *tok.encode(texts[0])]  # BOS, as Llama 3
    assert got["decoded"] == texts
    assert got["chat_text"] == tok.apply_chat_template(messages)
    assert got["chat_ids"] == tok.encode_chat(messages)
    assert got["special"] == [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id,
                              tok.vocab_size]


def test_training_on_the_committed_corpus_reproduces_the_shipped_tokenizer() -> None:
    spec = importlib.util.spec_from_file_location("train_tokenizer",
                                                  ROOT / "scripts" / "train_tokenizer.py")
    assert spec and spec.loader
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    config = config["doppelchip_training"]
    names, texts = train.corpus_texts(CORPUS)
    assert [f"scripts/corpus/{n}" for n in names] == config["corpus"]
    assert hashlib.sha256("\x00".join(texts).encode()).hexdigest() == config["corpus_sha256"]
    import tokenizers

    if tokenizers.__version__ != config["tokenizers"]:
        pytest.skip(f"trained with tokenizers {config['tokenizers']}, "
                    f"this is {tokenizers.__version__}")
    shipped = (TOKENIZER_DIR / "tokenizer.json").read_text()
    assert train.build(texts, config["vocab_size"]).to_str() == shipped


def test_constrained_sampling_picks_whole_characters(tok: Tokenizer) -> None:
    """Inside a JSON string the grammar allows fragments too; the sampler takes them only when
    nothing else is allowed, so constrained output is whole characters token by token."""
    from server.engine.constraints import ConstraintCompiler
    from server.engine.interface import Constraint

    compiler = ConstraintCompiler(tok)
    schema = Constraint("json_schema", json.dumps(
        {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}))
    state = compiler.start(schema, 1 << 20)
    while len(state.allowed()) < 1000:  # into the string, past {"note":"
        state.next_token(0, False)
    assert not set(state.allowed().tolist()) <= set(tok.normal_token_ids)  # fragments allowed
    normal = set(tok.normal_token_ids) | {tok.eos_token_id}
    rng = random.Random(0)
    for _ in range(100):
        state = compiler.start(schema, 1 << 20)
        tokens = [state.next_token(rng.getrandbits(64), closing=n > 40) for n in range(60)]
        assert set(tokens) <= normal
