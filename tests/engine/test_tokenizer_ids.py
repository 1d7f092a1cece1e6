"""token_ids.json: the ids the engine needs, read without parsing tokenizer.json (start-up),
current with the shipped tokenizer, and ignored once stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from server.engine.tokenizer import (
    IDS_FILE,
    TOKENIZER_DIR,
    Tokenizer,
    parse,
    read_ids,
    vocabulary_ids,
    write_ids,
)

ATTRS = ("bos_token_id", "eos_token_id", "pad_token_id", "vocab_size", "special_token_ids",
         "free_text_token_ids")


def _from_vocabulary(directory: Path) -> dict[str, object]:
    config = json.loads((directory / "tokenizer_config.json").read_text())
    return vocabulary_ids(parse(directory), config)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    out = tmp_path / "tok"
    shutil.copytree(TOKENIZER_DIR, out, ignore=shutil.ignore_patterns("__pycache__"))
    return out


def test_shipped_ids_file_is_current():
    """Fails when tokenizer.json or tokenizer_config.json changed without `write_ids`
    (scripts/train_tokenizer.py)."""
    assert read_ids(TOKENIZER_DIR) == _from_vocabulary(TOKENIZER_DIR)


def test_ids_file_spares_the_vocabulary_parse_and_gives_the_same_tokenizer(copy: Path):
    fast = Tokenizer(copy)
    assert "_tok" not in vars(fast)  # the Rust tokenizer not parsed yet
    (copy / IDS_FILE).unlink()
    slow = Tokenizer(copy)
    assert "_tok" in vars(slow)
    for name in ATTRS:
        assert getattr(fast, name) == getattr(slow, name), name
    assert fast.encode("Hello, world!") == slow.encode("Hello, world!")  # parsed on use
    assert fast.decode(fast.encode("Hello, world!")) == "Hello, world!"


@pytest.mark.parametrize("victim", ["tokenizer.json", "tokenizer_config.json"])
def test_a_stale_ids_file_is_ignored(copy: Path, victim: str):
    raw = json.loads((copy / IDS_FILE).read_text())
    raw["eos_token_id"] = 999  # what a stale file might say
    (copy / IDS_FILE).write_text(json.dumps(raw))
    assert read_ids(copy)["eos_token_id"] == 999  # the digest still matches: trusted
    text = (copy / victim).read_text()
    (copy / victim).write_text(text.rstrip("\n") + "\n\n")  # same JSON, other bytes
    assert read_ids(copy) is None
    assert Tokenizer(copy).eos_token_id == Tokenizer().eos_token_id != 999


@pytest.mark.parametrize("content", ["", "{", "[]", "{}", '{"inputs_sha256": "x"}'])
def test_a_damaged_or_absent_ids_file_is_ignored(copy: Path, content: str):
    (copy / IDS_FILE).write_text(content)
    assert read_ids(copy) is None
    (copy / IDS_FILE).unlink()
    assert read_ids(copy) is None
    assert Tokenizer(copy).free_text_token_ids == Tokenizer().free_text_token_ids


def test_write_ids_round_trips(copy: Path):
    (copy / IDS_FILE).unlink()
    write_ids(copy)
    assert read_ids(copy) == _from_vocabulary(copy)
