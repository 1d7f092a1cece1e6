"""`sglang serve --speculative-algorithm ...` translated as SGLang 0.5.23 resolves it
(doppelchip/sglang_spec.py): the method (a draft head, or the model's own MTP layer), the
chain's drafts or the tree's, SGLang's defaults by architecture, its warnings, the 48-request
cap, and SGLang's simulated acceptance (SGLANG_SIMULATE_ACC_LEN and _METHOD); what is not
emulated is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from doppelchip.cli import build_parser
from doppelchip.cmd_sglang import translate
from doppelchip.sglang_argv import sglang_argv

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"
DRAFT = ("--speculative-draft-model-path", "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B")
CHAIN = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4")
CAP = ("Max running requests is reset to 48 for speculative decoding. You can override this "
       "by explicitly setting --max-running-requests.")


def run(*argv: str, acc: str | None = "2.5", method: str | None = None
        ) -> tuple[dict | None, list[str], list[str]]:
    """(the pod's speculative_config, its `serve` argv, the warnings) for `sglang serve ARGV`
    with SGLANG_SIMULATE_ACC_LEN=`acc` (and SGLANG_SIMULATE_ACC_METHOD=`method`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIMULATE_ACC")}
    if acc is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = acc
    if method is not None:
        env["SGLANG_SIMULATE_ACC_METHOD"] = method
    with mock.patch.dict(os.environ, env, clear=True):
        out, said = translate(build_parser("sglang").parse_args(
            sglang_argv(["sglang", "serve", *argv])))
    config = out[out.index("--speculative-config") + 1] if "--speculative-config" in out \
        else None
    return (json.loads(config) if config else None), out, said


def test_an_eagle3_chain_is_the_pods_speculative_config():
    config, out, said = run(LLAMA, "--speculative-algorithm", "eagle3", *DRAFT, *CHAIN)
    # a chain, accepting SGLANG_SIMULATE_ACC_LEN tokens per verification by SGLang's default
    # method (devices/speculative.py: SGLang's sample_simulated_acc_len)
    assert config == {"method": "eagle3", "num_speculative_tokens": 3, "model": DRAFT[1],
                      "acceptance_length": 2.5, "acceptance_method": "match-expected"}
    # SGLang's cap and the engine's per-request tally (for /generate's meta_info)
    assert out[out.index("--max-num-seqs") + 1] == "48" and said == [CAP]
    assert out[out.index("--per-request-spec-decode-metrics") + 1] == "summary"
    _, out, said = run(LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, *CHAIN,
                       "--max-running-requests", "16")
    assert out[out.index("--max-num-seqs") + 1] == "16" and said == []


def test_the_models_own_mtp_layer_and_sglangs_defaults_by_architecture():
    for algorithm in ("NEXTN", "EAGLE"):  # EAGLE without a draft on DeepSeek: its MTP layer
        config, _, said = run(DEEPSEEK, "--speculative-algorithm", algorithm)
        assert (config["method"], config["num_speculative_tokens"]) == ("mtp", 3)  # (3, 1, 4)
        assert "eagle_topk" not in config and said == [CAP]  # a chain
    # Llama's default is a tree: 5 draft steps, 4 branches, the 8 best tokens verified
    config, _, said = run(LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT)
    assert {k: config[k] for k in ("num_speculative_tokens", "eagle_topk",
                                   "num_draft_tokens")} == {
        "num_speculative_tokens": 5, "eagle_topk": 4, "num_draft_tokens": 8}
    assert said == [CAP]  # (no draft-token warning: that is a chain's)


def test_a_tree_keeps_its_draft_tokens_within_what_its_steps_score():
    config, _, said = run(LLAMA, "--speculative-algorithm", "EAGLE", *DRAFT,
                          "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                          "--speculative-num-draft-tokens", "11", "--max-running-requests", "8")
    assert (config["eagle_topk"], config["num_draft_tokens"]) == (2, 11) and said == []
    # 2 + 2 × 2² = 10 candidates + the root: 12 is more than the draft passes score
    with pytest.raises(ValueError, match="from 2 to 11"):
        run(LLAMA, "--speculative-algorithm", "EAGLE", *DRAFT, "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "12")
    with pytest.raises(ValueError, match="a tree needs --speculative-num-draft-tokens"):
        run(LLAMA, "--speculative-algorithm", "EAGLE", *DRAFT, "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "2")


def test_a_chain_gets_steps_plus_one_draft_tokens_with_sglangs_warning():
    config, _, said = run(LLAMA, "--speculative-algorithm", "EAGLE", *DRAFT,
                          "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                          "--speculative-num-draft-tokens", "8")
    assert config["num_speculative_tokens"] == 2
    assert said[0] == ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                       "when speculative_eagle_topk == 1")


@pytest.mark.parametrize("method", [None, "match-expected", "multinomial"])
def test_sglangs_simulation_method_is_the_acceptance_method(method):
    config, _, _ = run(LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, *CHAIN, acc="9",
                       method=method)
    # (the length is clamped to what the steps can accept by the engine's draw, as SGLang's)
    assert (config["acceptance_length"], config["acceptance_method"]) == \
        (9.0, method or "match-expected")
    with pytest.raises(ValueError, match="Invalid simulate_acc_method: uniform"):  # SGLang's
        run(LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, *CHAIN, method="uniform")


@pytest.mark.parametrize("argv, acc, says", [
    ((LLAMA, "--speculative-algorithm", "NGRAM"), "2", "emulated are EAGLE, EAGLE3, NEXTN"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3"), "2",
     "EAGLE3 needs --speculative-draft-model-path"),
    ((LLAMA, "--speculative-algorithm", "NEXTN", *CHAIN), "2",
     "has no multi-token-prediction layer"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, "--speculative-eagle-topk", "1"), "2",
     "need --speculative-num-steps"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, "--speculative-num-steps", "5",
      "--speculative-eagle-topk", "0"), "2", "at least one branch"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, *CHAIN), None,
     "needs SGLANG_SIMULATE_ACC_LEN=L"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, *CHAIN), "-1",
     "needs SGLANG_SIMULATE_ACC_LEN=L"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, *CHAIN), "two", "is not a number"),
])
def test_what_is_not_emulated_is_refused(argv, acc, says):
    with pytest.raises(ValueError, match=says):
        run(*argv, acc=acc)


def test_without_speculation_nothing_changes_and_a_refusal_stops_the_launch():
    config, out, _ = run(LLAMA, acc=None)
    assert config is None and "--per-request-spec-decode-metrics" not in out
    assert "--max-num-seqs" not in out
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_SIMULATE_ACC_LEN"}
    done = subprocess.run([sys.executable, "-m", "doppelchip.cli", "sglang", "serve", LLAMA,
                           "--speculative-algorithm", "EAGLE3", *DRAFT, *CHAIN, "--port", "0"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "needs SGLANG_SIMULATE_ACC_LEN=L" in done.stderr
