"""Train the engine's byte-level BPE tokenizer once; the output is committed.

    .venv/bin/python scripts/train_tokenizer.py            # writes server/engine/tokenizer_data/

The corpus is offline and reproducible: English prose that ships with the Python interpreter —
its reference documentation (``pydoc_data/topics.py``) and the docstrings of the top-level
standard-library modules (``Lib/*.py``, sorted by name) — optionally plus files given with
``--extra``. The script records the Python version and the corpus digest in
``tokenizer_config.json``; training twice on the same corpus gives the same ``tokenizer.json``.
Nothing at run time trains or downloads a tokenizer: ``server/engine/tokenizer.py`` only loads
this directory.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import platform
import pydoc_data.topics
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = Path(__file__).resolve().parent.parent / "server" / "engine" / "tokenizer_data"

BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", EOT, "<|pad|>"]

# Llama 3 style. Jinja filters bind tighter than '+', so only the content is trimmed.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


DOCUMENTED = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def corpus_texts(extra: list[Path]) -> list[str]:
    topics = pydoc_data.topics.topics
    texts = [topics[k] for k in sorted(topics)]
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, DOCUMENTED) and (doc := ast.get_docstring(node, clean=True)):
                texts.append(doc)
    texts += [p.read_text(encoding="utf-8") for p in extra]
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--extra", type=Path, nargs="*", default=[], help="more UTF-8 text files")
    args = ap.parse_args()

    texts = corpus_texts(args.extra)
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)

    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": "<|pad|>",
        "additional_special_tokens": [EOS, "<|start_header_id|>", "<|end_header_id|>"],
        "add_bos_token": False,
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "doppelchip_training": {
            "script": "scripts/train_tokenizer.py",
            "corpus": "pydoc_data/topics.py + docstrings of Lib/*.py (Python stdlib)"
            + "".join(f" + {p.name}" for p in args.extra),
            "python": platform.python_version(),
            "corpus_sha256": digest,
            "vocab_size": tok.get_vocab_size(),
        },
    }
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in sorted(args.out.iterdir()):
        print(f"{f}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
