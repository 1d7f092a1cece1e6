"""Text ↔ token ids with the committed Llama-3-style byte-level BPE (``tokenizer_data/``).

The tokenizer directory is trained once by ``scripts/train_tokenizer.py`` and shipped with the
package; this module only loads it (never trains, never downloads). The same directory is a
Hugging Face tokenizer (``transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)`` loads it
offline), so load tools and gateways count tokens as the engine does (docs/TOKENIZER.md).

Contract:
- ``encode(text)`` → ids (no BOS added; ``apply_chat_template`` adds it), ``decode(ids)`` →
  text with special tokens skipped. Byte-level BPE is lossless: ``decode(encode(t)) == t``.
- ``normal_token_ids`` are the ids the mock model may generate: not special, and whose bytes
  are complete UTF-8 on their own, so a client that decodes generated tokens one at a time
  never sees U+FFFD. Other ids (single bytes ≥ 0x80, pieces of a multi-byte character) still
  occur in encoded prompts and in ids a client sends.
- ``free_text_token_ids`` are the ids the mock model draws its free (unconstrained) text from:
  a space and ASCII letters (" word"). Any concatenation of them re-tokenizes to the same ids
  (``encode(decode(ids)) == ids``: each is one pre-token of the split regex, and the vocabulary
  holds it whole), so a client that counts the tokens of the text it received (AIPerf without
  server token counts) counts what the server generated.
- ``IncrementalDetokenizer`` turns a stream of ids into text deltas whose concatenation equals
  ``decode`` of all the ids: each id maps to its bytes, and an incremental UTF-8 decoder holds
  back a multi-byte character split across tokens until it is complete (as vLLM's detokenizer
  holds back text that ends in an incomplete character).
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where the vocabulary is first parsed (see `Tokenizer._tok`)
    from tokenizers import Tokenizer as HFTokenizer

TOKENIZER_DIR = Path(__file__).resolve().parent / "tokenizer_data"
# what the engine services' model info names for every model: the mock model and this
# tokenizer are Llama-shaped
MODEL_TYPE, ARCHITECTURES = "llama", ("LlamaForCausalLM",)


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-level alphabet (GPT-2): printable bytes map to themselves, the others to
    code points from 256 up, so every byte is a visible character in the vocabulary."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _complete_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(b)


_FREE_WORD = re.compile("\u0120[A-Za-z]+")  # byte-level BPE's " word": the bytes b" [A-Za-z]+"


class Tokenizer:
    """The packaged tokenizer (or another directory in the same format): ids, text, bytes."""

    def __init__(self, directory: Path | str = TOKENIZER_DIR) -> None:
        self._dir = directory = Path(directory)
        self.config: dict = json.loads((directory / "tokenizer_config.json").read_text())
        self.chat_template: str = self.config["chat_template"]
        self.bos_token: str = self.config["bos_token"]
        self.eos_token: str = self.config["eos_token"]
        ids = read_ids(directory)
        if ids is None:  # no (or a stale) ids file: the vocabulary has them
            ids = vocabulary_ids(self._tok, self.config)
        self.bos_token_id: int = ids["bos_token_id"]
        self.eos_token_id: int = ids["eos_token_id"]
        self.pad_token_id: int | None = ids["pad_token_id"]
        self.vocab_size: int = ids["vocab_size"]
        self.special_token_ids = frozenset(ids["special_token_ids"])
        # " word" tokens straight from the byte-level vocabulary's strings (a space is "Ġ",
        # ASCII letters stand for themselves): what the mock model draws, without building
        # every token's bytes at start-up (`_token_bytes` is computed on first use)
        self._free_ids: tuple[int, ...] = tuple(ids["free_text_token_ids"])

    @functools.cached_property
    def _tok(self) -> HFTokenizer:
        """The Rust tokenizer, parsed on first use (~0.1 s): a simulation that only draws ids
        needs just the ids file's figures."""
        return parse(self._dir)

    @functools.cached_property
    def _token_bytes(self) -> list[bytes]:
        """Bytes each id stands for; special tokens stand for nothing (they are skipped)."""
        byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
        out: list[bytes] = [b""] * self.vocab_size
        for token, i in self._tok.get_vocab(with_added_tokens=True).items():
            if i not in self.special_token_ids:
                out[i] = bytes(byte_of[ch] for ch in token)
        return out

    @functools.cached_property
    def _normal_ids(self) -> tuple[int, ...]:
        return tuple(i for i, b in enumerate(self._token_bytes)
                     if i not in self.special_token_ids and _complete_utf8(b))

    def _id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return i

    @property
    def normal_token_ids(self) -> list[int]:
        """Ids the mock model draws from: not special, and their bytes are valid UTF-8 by
        themselves (no byte-level fragment of a multi-byte character)."""
        return list(self._normal_ids)

    @property
    def free_text_token_ids(self) -> tuple[int, ...]:
        """Ids the mock model's free text is made of: " word" tokens (a space, ASCII
        letters), whose concatenations re-tokenize to themselves."""
        return self._free_ids

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_pair(self, first: str, second: str) -> list[int]:
        """The two texts as one input, with the special tokens of the tokenizer's pair template
        (Hugging Face's `tokenizer(text=first, text_pair=second)`: "<bos> first <bos> second"
        here, as Llama 3's): a cross-encoder's (query, document) prompt."""
        return self._tok.encode(first, second, add_special_tokens=True).ids

    def encode_unlocked(self, text: str) -> list[int]:
        """`encode`, releasing the GIL while the Rust tokenizer works (`tokenizers` releases
        it in batch encoding only): what a thread runs so an event loop keeps serving while a
        long prompt is tokenized. The same ids as `encode`."""
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def decode_with_special(self, ids: Sequence[int]) -> str:
        """`decode` that writes special tokens out ("<|begin_of_text|>…"), as a Hugging Face
        tokenizer's `decode(ids)` does by default (what vLLM's /detokenize and its echo of a
        token-id prompt answer)."""
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Each id's vocabulary string: byte-level BPE's alphabet ("Ġworld" for " world"),
        special tokens by name — Hugging Face's `convert_ids_to_tokens`."""
        tok = self._tok
        return [tok.id_to_token(i) or "" for i in ids]

    def to_json(self) -> str:
        """The tokenizer as `tokenizer.json` text (what grammar engines load)."""
        return self._tok.to_str()

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes[token_id]

    def apply_chat_template(
        self, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` ({"role", "content"}) as ``chat_template`` does (written out
        in Python: jinja2 is not a dependency)."""
        parts = [self.bos_token]
        for m in messages:
            parts.append(
                f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
                f"{m['content'].strip()}<|eot_id|>"
            )
        if add_generation_prompt:
            parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
        return "".join(parts)

    def encode_chat(
        self, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Chat messages to ids; the template's special tokens become their ids."""
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self._tok.encode(text, add_special_tokens=False).ids

    def warm(self) -> None:
        """Parse the Rust tokenizer and build the byte table now (~0.3 s), as a serving process
        does at start-up: otherwise its first request pays for them while it streams."""
        self._tok  # noqa: B018  (cached properties: computed once)
        self._token_bytes  # noqa: B018

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)


class IncrementalDetokenizer:
    """Streaming text deltas: ``"".join(push(i) for i in ids) + flush() == decode(ids)``."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._bytes = tokenizer._token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by this token ("" while a character is still incomplete)."""
        return self._utf8.decode(self._bytes[token_id])

    def push_many(self, token_ids: Sequence[int]) -> str:
        if len(token_ids) == 1:
            return self._utf8.decode(self._bytes[token_ids[0]])
        return self._utf8.decode(b"".join([self._bytes[i] for i in token_ids]))

    def flush(self) -> str:
        """End of stream: an incomplete trailing character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)


IDS_FILE = "token_ids.json"  # derived from the two files below; see `read_ids`
_IDS_INPUTS = ("tokenizer.json", "tokenizer_config.json")


def _inputs_digest(directory: Path) -> str:
    h = hashlib.sha256()
    for name in _IDS_INPUTS:
        data = (directory / name).read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def parse(directory: Path) -> HFTokenizer:
    """``directory/tokenizer.json`` as a ``tokenizers.Tokenizer`` (the Rust library is
    imported here, on first use)."""
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer.from_file(str(directory / "tokenizer.json"))


def vocabulary_ids(tok: HFTokenizer, config: Mapping[str, object]) -> dict[str, object]:
    """The ids the engine needs from the vocabulary: BOS/EOS/pad, the size, the special ids
    and the free-text ids (" word" tokens, see the module contract)."""
    def token_id(token: object) -> int:
        i = tok.token_to_id(str(token))
        if i is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return i

    special = sorted({token_id(t.content) for t in tok.get_added_tokens_decoder().values()})
    free = sorted(i for token, i in tok.get_vocab(with_added_tokens=True).items()
                  if i not in special and _FREE_WORD.fullmatch(token))
    pad = config.get("pad_token")
    return {"bos_token_id": token_id(config["bos_token"]),
            "eos_token_id": token_id(config["eos_token"]),
            "pad_token_id": token_id(pad) if pad else None,
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "special_token_ids": special, "free_text_token_ids": free}


def read_ids(directory: Path) -> dict[str, object] | None:
    """``directory/token_ids.json`` if it was written from this ``tokenizer.json`` and
    ``tokenizer_config.json`` (their SHA-256 is recorded in it), else None.

    Why the file exists: parsing ``tokenizer.json`` costs ~0.1 s, most of a one-request
    simulation's start-up, which needs only these ids; the digest makes a stale file
    harmless (the ids then come from the vocabulary, as without the file)."""
    try:
        raw = json.loads((directory / IDS_FILE).read_text())
        if raw.pop("inputs_sha256") != _inputs_digest(directory):
            return None
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    return raw


def write_ids(directory: Path) -> Path:
    """Write ``directory/token_ids.json`` from its tokenizer (scripts/train_tokenizer.py runs
    this after training; tests/engine/test_tokenizer_ids.py checks the shipped file)."""
    config = json.loads((directory / "tokenizer_config.json").read_text())
    ids = vocabulary_ids(parse(directory), config)
    out = directory / IDS_FILE
    out.write_text(json.dumps({"inputs_sha256": _inputs_digest(directory), **ids}) + "\n")
    return out


@functools.cache
def get_tokenizer() -> Tokenizer:
    """The packaged tokenizer, loaded once per process."""
    return Tokenizer()
