"""A classifier's emulated answers (server/frontend/classified.py) and a cross-encoder's score
template (server/engine/score_template.py): logits about standard normal and deterministic,
vLLM's activation (a sigmoid for one label, a softmax over several), a pair's probability the
texts' bag-of-tokens cosine; the template loaded and refused as vLLM loads it, rendered with
the request's kwargs, reserved ones refused."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from server.engine import score_template
from server.engine.intake import Limits
from server.engine.interface import PoolingParams
from server.frontend.classified import EPS, activated, label_logits, pair_logit
from server.frontend.pooled import text_vector
from server.http.pooling import output

ROOT = Path(__file__).resolve().parents[2]


def test_logits_are_about_standard_normal_and_deterministic():
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 150_000) for _ in range(rng.randrange(3, 40))]
               for _ in range(400)]
    logits = np.array([label_logits(p, 3, 1024) for p in prompts])
    assert logits.shape == (400, 3)
    assert abs(logits.mean()) < 0.2 and 0.8 < logits.std() < 1.2
    assert np.array_equal(label_logits(prompts[0], 3, 1024), logits[0])
    # the labels read different directions: their logits are not the same numbers
    assert not np.allclose(logits[:, 0], logits[:, 1])


def test_vllms_activation_for_one_label_and_several():
    assert activated(np.array([0.0]), True) == [0.5]
    assert activated(np.array([2.0]), False) == [2.0]
    probs = activated(np.array([1.0, 2.0, 3.0]), True)
    assert sum(probs) == pytest.approx(1.0) and probs == sorted(probs)
    assert probs[2] / probs[1] == pytest.approx(math.e)


def test_a_pairs_probability_is_the_texts_overlap():
    def logit(a: list[int], b: list[int], special: frozenset[int] = frozenset()) -> float:
        return pair_logit(text_vector(a, 1024, special), text_vector(b, 1024, special))

    same, none, some = logit([5, 6, 7], [5, 6, 7]), logit([5, 6, 7], [8, 9, 10]), \
        logit([5, 6, 7], [5, 6, 10])
    assert none < some < same
    assert activated(np.array([same]), True)[0] == pytest.approx(1 - EPS)
    assert activated(np.array([some]), True)[0] == pytest.approx(2 / 3, abs=0.05)
    # special tokens (a BOS every prompt has) are no likeness
    assert logit([1, 8], [1, 9], frozenset({1})) == pytest.approx(math.log(EPS / (1 - EPS)))


def test_a_classifier_of_several_labels_answers_a_distribution():
    limits = Limits(name="c", vocab_size=150_000, max_model_len=512, num_blocks=10,
                    block_size=16, max_waiting=4, max_grammar_bytes=1, pooling_task="classify",
                    embedding_size=1024, num_labels=3)
    probs = output([5, 6, 7], limits, PoolingParams(task="classify"), frozenset())
    assert probs.shape == (3,) and float(probs.sum()) == pytest.approx(1.0, rel=1e-6)
    raw = output([5, 6, 7], limits, PoolingParams(task="classify", use_activation=False),
                 frozenset())
    assert int(np.argmax(raw)) == int(np.argmax(probs))


def test_the_template_is_loaded_as_vllm_loads_it(tmp_path):
    path = ROOT / score_template.QWEN3_RERANKER_TEMPLATE
    assert score_template.load(str(path)) == path.read_text()
    assert score_template.load("{{ messages[0].content }}") == "{{ messages[0].content }}"
    assert score_template.load(None) == ""
    with pytest.raises(ValueError, match=r"\(no/such.jinja\) looks like a file path"):
        score_template.load("no/such.jinja")


def test_the_qwen3_reranker_template_renders_the_model_cards_prompt():
    template = score_template.load(str(ROOT / score_template.QWEN3_RERANKER_TEMPLATE))
    text = score_template.render(template, "what is x?", "x is y.", {"instruction": "Find x"})
    assert text == (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
        "Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
        "<|im_end|>\n<|im_start|>user\n<Instruct>: Find x\n<Query>: what is x?\n"
        "<Document>: x is y.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    default = score_template.render(template, "q", "d", None)
    assert "<Instruct>: Given a web search query, retrieve relevant passages that answer " \
        "the query\n" in default
    with pytest.raises(ValueError, match="reserved keys"):
        score_template.render(template, "q", "d", {"tools": []})
    with pytest.raises(ValueError, match="failed to render"):
        score_template.render("{{ messages[0].content | nosuchfilter }}", "q", "d", None)


def test_an_original_qwen3_reranker_without_its_template_gets_vllms_advice():
    original = '{"is_original_qwen3_reranker": true, "classifier_from_token": ["no", "yes"]}'
    advice = score_template.check("qwen3-reranker-8b", original, None)
    assert advice.startswith("Serving an original Qwen3 reranker (qwen3-reranker-8b) without")
    assert score_template.QWEN3_RERANKER_TEMPLATE in advice
    assert score_template.check("qwen3-reranker-8b", original, "{{ x }}") == ""
    assert score_template.check("m", '{"method": "no_post_processing"}', None) == ""
    with pytest.raises(ValueError, match="looks like a file path"):
        score_template.check("m", None, "missing.jinja")
