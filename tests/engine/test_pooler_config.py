"""`--pooler-config` parsed as vLLM 0.33.0's PoolerConfig (its fields, its refusals and their
words), and what it decides in the scheduler: a decoder pooled by MEAN or CLS neither caches
prefixes nor chunks prefills; LAST (the catalogue's) does; an encoder never does."""

from __future__ import annotations

import logging

import pytest

from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.pooler_config import PoolerOptions, parse

EMBED = dict(name="e", model="qwen3-embedding-0.6b", quant="bf16", chip="h100-sxm",
             engine="vllm")


@pytest.mark.parametrize("text, says", [
    ('{"normalize": true}', "Parameter `normalize` was removed; use `use_activation` instead."),
    ('{"pooling_type": "MEAN", "seq_pooling_type": "CLS"}',
     "Cannot set both `pooling_type` and `seq_pooling_type`"),
    ('{"pooling_type": "STEP", "tok_pooling_type": "ALL"}',
     "Cannot set both `pooling_type` and `tok_pooling_type`"),
    ('{"logit_sigma": 0}', "logit_sigma cannot be 0 (division by zero)"),
    ('{"task": "score"}', "`score` task was removed; use `classify` instead."),
    ('{"pooling_type": "MAX"}', "pooling_type 'MAX' is not one of CLS, LAST, MEAN, ALL, STEP"),
    ('{"dimension": 8}', "--pooler-config: unknown key(s) dimension"),
    ('{"dimensions": 0}', "dimensions must be a positive int"),
    ('{"use_activation": "no"}', "use_activation is true or false"),
    ('{"logit_mean": "1"}', "logit_mean must be a number"),
    ("[1]", "must be a JSON object"), ("{", "is not valid JSON"),
])
def test_what_vllm_would_not_start_with_is_refused_in_its_words(text, says):
    with pytest.raises(ValueError) as refused:
        parse(text)
    assert says in str(refused.value)


def test_pooling_type_resolves_to_sequence_or_token_pooling():
    assert parse('{"pooling_type": "MEAN"}').seq_pooling_type == "MEAN"
    step = parse('{"pooling_type": "STEP", "max_embed_len": 4}')
    assert step.seq_pooling_type is None and step.tok_pooling_type == "STEP"
    assert step.ignored == ("tok_pooling_type", "max_embed_len")
    assert not step.caches_and_chunks("LAST")  # STEP pooling: neither (vLLM)
    assert parse(None) == PoolerOptions() and PoolerOptions().caches_and_chunks("LAST")
    assert not PoolerOptions().caches_and_chunks("CLS")


@pytest.mark.parametrize("config, cached", [(None, True), ('{"pooling_type": "LAST"}', True),
                                            ('{"pooling_type": "MEAN"}', False),
                                            ('{"seq_pooling_type": "CLS"}', False)])
def test_a_decoder_pooled_by_mean_or_cls_neither_caches_nor_chunks(config, cached):
    cfg = build_core(EngineOptions(**EMBED, pooler_config=config)).scheduler.config
    assert cfg.enable_prefix_caching is cached and cfg.enable_chunked_prefill is cached
    if not cached:  # a whole prompt per step (vLLM's budget without chunking)
        assert cfg.max_num_batched_tokens == cfg.max_model_len == 32768


def test_asked_for_anyway_a_mean_pooled_decoder_caches_with_vllms_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="doppelchip.engine"):
        cfg = build_core(EngineOptions(**EMBED, pooler_config='{"pooling_type": "MEAN"}',
                                       prefix_cache=True)).scheduler.config
    assert cfg.enable_prefix_caching  # (a decoder keeps its KV blocks: vLLM caches them)
    assert any("does not officially support prefix caching" in r.getMessage()
               for r in caplog.records)


def test_the_task_must_be_the_models_and_a_generative_model_ignores_it(caplog):
    build_core(EngineOptions(**EMBED, pooler_config='{"task": "embed"}'))
    with pytest.raises(ValueError, match=r"Unsupported task: 'classify' Supported tasks: "
                                         r"\('embed',\)"):
        build_core(EngineOptions(**EMBED, pooler_config='{"task": "classify"}'))
    with pytest.raises(ValueError, match="token-level pooling is not emulated"):
        build_core(EngineOptions(**EMBED, pooler_config='{"task": "token_embed"}'))
    gen = dict(EMBED, model="llama-3.1-8b")
    with caplog.at_level(logging.WARNING, logger="doppelchip.engine"):
        cfg = build_core(EngineOptions(**gen, pooler_config='{"pooling_type": "MEAN"}'))
    assert cfg.scheduler.config.enable_prefix_caching  # (not a pooling model: unchanged)
    assert any("--pooler-config is ignored" in r.getMessage() for r in caplog.records)
