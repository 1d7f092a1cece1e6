"""Train the engine's Llama-3-style byte-level BPE tokenizer once; the output is committed.

    .venv/bin/python scripts/train_tokenizer.py            # writes server/engine/tokenizer_data/

The corpus is the public-domain English prose committed in ``scripts/corpus/train/`` (how it was
taken from Debian packages, and why these texts: ``docs/TOKENIZER.md``); each file is checked
against ``scripts/corpus/SHA256SUMS`` before training. The tokenizer copies Llama 3's shape:
its pre-tokenizer split regex, byte-level BPE (``tokenizers``), whole-word lookup before merges
(``ignore_merges``), a BOS post-processor, and the same special tokens and chat template as
before. The script writes ``tokenizer.json`` plus the Hugging Face side files
(``tokenizer_config.json``, ``special_tokens_map.json``) so ``AutoTokenizer`` loads the
directory offline, and records the corpus digest and library versions in
``tokenizer_config.json``, then ``token_ids.json`` (the ids the engine reads without parsing
``tokenizer.json``, with the SHA-256 of the files they come from). Training twice on the same
corpus gives the same ``tokenizer.json``.
Nothing at run time trains or downloads a tokenizer: ``server/engine/tokenizer.py`` only loads
the directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import platform
from pathlib import Path

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from server.engine.tokenizer import write_ids

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "server" / "engine" / "tokenizer_data"
CORPUS = ROOT / "scripts" / "corpus"

BOS, EOS, EOT, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", EOT, PAD]  # ids 0..5

# Llama 3's pre-tokenizer (its tokenizer.json "Split" pattern, as llama3-tokenizer-js 1.2.0
# ships it): contractions, letters with one leading non-letter, 1-3 digit groups, punctuation
# runs, newlines, other whitespace.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Llama 3 style. Jinja filters bind tighter than '+', so only the content is trimmed.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def corpus_texts(corpus: Path) -> tuple[list[str], list[str]]:
    """(names, texts) of ``corpus/train/*.txt.xz`` in name order, each checked against the
    digest ``corpus/SHA256SUMS`` records for it."""
    sums = {}
    for line in (corpus / "SHA256SUMS").read_text().splitlines():  # "digest  path"
        digest, name = line.split(maxsplit=1)
        sums[name] = digest
    names, texts = [], []
    for path in sorted((corpus / "train").glob("*.txt.xz")):
        data = lzma.decompress(path.read_bytes())
        name = f"train/{path.name.removesuffix('.xz')}"
        if hashlib.sha256(data).hexdigest() != sums.get(name):
            raise SystemExit(f"{path}: not the text SHA256SUMS records for {name}")
        names.append(name)
        texts.append(data.decode("utf-8"))
    if not texts:
        raise SystemExit(f"no corpus files in {corpus / 'train'}")
    return names, texts


def build(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.model.ignore_merges = True  # as Llama 3: a word in the vocabulary is one token
    # As Llama 3's: encoding with add_special_tokens=True (transformers' default) adds BOS.
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1",
                                      special_tokens=[(BOS, bos_id)]),
    ])
    return tok


def hf_config(tok: Tokenizer, names: list[str], digest: str) -> dict:
    """``tokenizer_config.json``: what transformers' AutoTokenizer reads, plus provenance."""
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                       "rstrip": False, "single_word": False, "special": True}
             for t in SPECIAL_TOKENS}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": PAD,
        "additional_special_tokens": [EOS, "<|start_header_id|>", "<|end_header_id|>"],
        "added_tokens_decoder": added,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,  # keeps decode lossless
        "chat_template": CHAT_TEMPLATE,
        "doppelchip_training": {
            "script": "scripts/train_tokenizer.py",
            "corpus": [f"scripts/corpus/{n}" for n in names],
            "corpus_sha256": digest,
            "vocab_size": tok.get_vocab_size(),
            "python": platform.python_version(),
            "tokenizers": tokenizers.__version__,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="folder with train/, SHA256SUMS")
    args = ap.parse_args()

    names, texts = corpus_texts(args.corpus)
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    tok = build(texts, args.vocab_size)

    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"), pretty=False)
    config = hf_config(tok, names, digest)
    special_map = {k: config[k] for k in
                   ("bos_token", "eos_token", "pad_token", "additional_special_tokens")}
    for name, obj in [("tokenizer_config.json", config),
                      ("special_tokens_map.json", special_map)]:
        (args.out / name).write_text(json.dumps(obj, indent=2) + "\n")
    write_ids(args.out)  # the ids the engine reads without parsing tokenizer.json
    for f in sorted(args.out.iterdir()):
        print(f"{f}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
