"""trtllm-serve's `speculative_config` (its `--config` YAML) as the pod's speculative decoding
(doppelchip/trtllm_spec.py): Eagle3 chains and dynamic trees, MTP with the checkpoint's layers,
TensorRT-LLM's refusals and doppelchip's acceptance key; every accepted config starts a pod
serve's own parser takes, and the deployment it describes places."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from devices import catalog
from devices.speculative import SpeculativeConfig
from doppelchip import exit_codes
from doppelchip.cli import build_parser, main
from doppelchip.cmd_trtllm import translate
from doppelchip.trtllm_spec import speculative_config

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"
DRAFT = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def run(tmp_path: Path, yaml: str, model: str = LLAMA) -> tuple[dict | None, list[str]]:
    """(the pod's speculative_config, warnings) for a YAML file."""
    path = tmp_path / "extra.yaml"
    path.write_text(yaml)
    args = build_parser("trtllm-serve").parse_args(
        ["trtllm-serve", model, "--grpc", "--config", str(path), "--tp_size", "8"
         if model == DEEPSEEK else "1"])
    argv, warnings = translate(args)
    serve = build_parser("serve").parse_args(["serve", *argv])
    assert isinstance(serve, argparse.Namespace)
    config = serve.speculative_config
    return (json.loads(config) if config else None), warnings


def test_an_eagle3_chain(tmp_path):
    config, warnings = run(tmp_path, f"""\
speculative_config:
  decoding_type: Eagle3
  max_draft_len: 3
  speculative_model: {DRAFT}
  eagle3_one_model: true
  acceptance_rate: 0.7
""")
    assert config == {"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rate": 0.7,
                      "model": DRAFT}
    assert not any("speculative" in w for w in warnings), warnings
    spec = SpeculativeConfig.parse(config)
    assert spec.drafts_per_step == 3 and spec.eagle_topk == 1


def test_a_dynamic_tree_is_topk_branches_and_its_total_drafts_verified(tmp_path):
    base = f"""\
speculative_config:
  decoding_type: Eagle3
  max_draft_len: 4
  speculative_model_dir: {DRAFT}
  use_dynamic_tree: true
  dynamic_tree_max_topK: 3
  acceptance_rate: 0.6
"""
    config, _ = run(tmp_path, base)  # max_total_draft_tokens default: topK x max_draft_len
    assert (config["eagle_topk"], config["num_draft_tokens"]) == (3, 13)
    config, _ = run(tmp_path, base + "  max_total_draft_tokens: 8\n")
    spec = SpeculativeConfig.parse(config)
    assert (spec.eagle_topk, spec.num_draft_tokens, spec.drafts_per_step) == (3, 9, 8)
    # a topK without use_dynamic_tree is ignored, with TensorRT-LLM's warning: a chain
    config, warnings = run(tmp_path, base.replace("  use_dynamic_tree: true\n", ""))
    assert "eagle_topk" not in config and config["num_speculative_tokens"] == 4
    assert any("ignoring dynamic_tree_max_topK" in w for w in warnings)
    # MTP drafts a dynamic tree the same way
    config, _ = run(tmp_path, "speculative_config:\n  decoding_type: MTP\n  max_draft_len: 2\n"
                    "  use_dynamic_tree: true\n  dynamic_tree_max_topK: 2\n"
                    "  acceptance_rate: 0.6\n", DEEPSEEK)
    assert (config["method"], config["eagle_topk"], config["num_draft_tokens"]) == ("mtp", 2, 5)


def test_mtp_takes_the_checkpoints_layers_or_its_draft_length(tmp_path):
    config, _ = run(tmp_path, "speculative_config:\n  decoding_type: MTP\n  acceptance_rate: 0.8\n",
                    DEEPSEEK)
    assert config == {"method": "mtp", "num_speculative_tokens":
                      catalog.get_model("deepseek-v3").mtp_layers, "acceptance_rate": 0.8}
    two = replace(catalog.get_model("deepseek-v3"), mtp_layers=2)  # (a checkpoint with two)
    mtp = {"decoding_type": "MTP", "acceptance_rate": 0.8}
    assert json.loads(speculative_config(mtp, "here", two)[0])["num_speculative_tokens"] == 2
    config, warnings = run(tmp_path, "speculative_config:\n  decoding_type: MTP\n"
                           "  num_nextn_predict_layers: 3\n  acceptance_rate: 0.8\n", DEEPSEEK)
    assert config["num_speculative_tokens"] == 3
    assert any("'num_nextn_predict_layers' is deprecated" in w for w in warnings)
    config, _ = run(tmp_path, "speculative_config:\n  decoding_type: MTP\n  max_draft_len: 2\n"
                    "  acceptance_length: 2.4\n", DEEPSEEK)
    assert config["num_speculative_tokens"] == 2 and config["acceptance_length"] == 2.4


def test_what_changes_the_schedule_but_is_not_emulated_is_warned(tmp_path):
    _, warnings = run(tmp_path, f"""\
speculative_config:
  decoding_type: Eagle3
  max_draft_len: 3
  speculative_model: {DRAFT}
  acceptance_rate: 0.7
  max_concurrency: 16
  sa_config: {{threshold: 4}}
""")
    (said,) = [w for w in warnings if "speculative_config" in w]
    assert "max_concurrency, sa_config: accepted but not emulated" in said


@pytest.mark.parametrize("spec, says", [
    ("{max_draft_len: 3, acceptance_rate: 0.7}", "decoding_type is required"),
    ("{decoding_type: NGram, max_draft_len: 3, acceptance_rate: 0.7}",
     "decoding_type NGram: not emulated"),
    ("{decoding_type: Lookahead9, max_draft_len: 3}", "not a TensorRT-LLM decoding type"),
    (f"{{decoding_type: Eagle3, max_draft_len: 3, speculative_model: {DRAFT}}}",
     "add doppelchip's acceptance_rate"),
    ("{decoding_type: Eagle3, max_draft_len: 3, acceptance_rate: 0.7}",
     "Draft model must be provided for EAGLE"),
    (f"{{decoding_type: Eagle3, max_draft_len: 0, speculative_model: {DRAFT}, "
     "acceptance_rate: 0.7}", "max_draft_len must be > 0 for Eagle"),
    (f"{{decoding_type: Eagle3, max_draft_len: 3, speculative_model: {DRAFT}, "
     "acceptance_rate: 0.7, eagle_choices: [[0], [1]]}", "a static tree is not emulated"),
    (f"{{decoding_type: Eagle3, max_draft_len: 3, speculative_model: {DRAFT}, "
     "acceptance_rate: 0.7, use_dynamic_tree: true}", "dynamic_tree_max_topK should be provided"),
    (f"{{decoding_type: Eagle3, max_draft_len: 3, speculative_model: {DRAFT}, "
     "acceptance_rate: 0.7, use_dynamic_tree: true, dynamic_tree_max_topK: 2, "
     "max_total_draft_tokens: 7}", "max_total_draft_tokens (7) must be in [max_draft_len (3), "
     "dynamic_tree_max_topK * max_draft_len (6)]"),
    ("{decoding_type: MTP, acceptance_rate: 0.7, use_dynamic_tree: true, "
     "dynamic_tree_max_topK: 2}", "max_draft_len must be set when use_dynamic_tree is True"),
    ("{decoding_type: MTP, acceptance_rate: 0.7}", "has no multi-token-prediction layer"),
    (f"{{decoding_type: Eagle3, max_draft_len: 3, speculative_model: {DRAFT}, "
     "acceptance_rate: 1.5}", "acceptance_rate must be in [0, 1]"),
    ("[1, 2]", "speculative_config must be a mapping"),
])
def test_what_tensorrt_llm_or_doppelchip_refuses(tmp_path, capsys, monkeypatch, spec, says):
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: pytest.fail("served"))
    path = tmp_path / "extra.yaml"
    path.write_text(f"speculative_config: {spec}\n")
    assert main(["trtllm-serve", LLAMA, "--grpc", "--config", str(path)]) == exit_codes.USAGE
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
