"""`sglang serve --speculative-algorithm ...` translated as SGLang 0.5.23 resolves it
(doppelchip/sglang_spec.py): the method (a draft head, or the model's own MTP layer), the
chain's drafts, SGLang's defaults by architecture, its warnings, the 48-request cap, and the
acceptance rate whose chain gives SGLANG_SIMULATE_ACC_LEN; what is not emulated is refused."""

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


def run(*argv: str, acc: str | None = "2.5") -> tuple[dict | None, list[str], list[str]]:
    """(the pod's speculative_config, its `serve` argv, the warnings) for `sglang serve ARGV`
    with SGLANG_SIMULATE_ACC_LEN=`acc`."""
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_SIMULATE_ACC_LEN"}
    if acc is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = acc
    with mock.patch.dict(os.environ, env, clear=True):
        out, said = translate(build_parser("sglang").parse_args(
            sglang_argv(["sglang", "serve", *argv])))
    config = out[out.index("--speculative-config") + 1] if "--speculative-config" in out \
        else None
    return (json.loads(config) if config else None), out, said


def test_an_eagle3_chain_is_the_pods_speculative_config():
    config, out, said = run(LLAMA, "--speculative-algorithm", "eagle3", *DRAFT, *CHAIN)
    assert {k: config[k] for k in ("method", "num_speculative_tokens", "model")} == \
        {"method": "eagle3", "num_speculative_tokens": 3, "model": DRAFT[1]}
    # the chain whose mean accepted length (bonus included) is SGLANG_SIMULATE_ACC_LEN
    r = config["acceptance_rate"]
    assert sum(r**i for i in range(4)) == pytest.approx(2.5, abs=1e-9)
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
        assert said == [CAP]
    with pytest.raises(ValueError, match=r"default for LlamaForCausalLM: 5 steps, topk 4, 8 "
                       r"draft tokens\): tree drafts are not emulated"):
        run(LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT)


def test_a_chain_gets_steps_plus_one_draft_tokens_with_sglangs_warning():
    config, _, said = run(LLAMA, "--speculative-algorithm", "EAGLE", *DRAFT,
                          "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                          "--speculative-num-draft-tokens", "8")
    assert config["num_speculative_tokens"] == 2
    assert said[0] == ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                       "when speculative_eagle_topk == 1")


@pytest.mark.parametrize("acc, rate", [("1", 0.0), ("4", 1.0), ("9", 1.0)])
def test_the_simulated_length_is_clamped_to_what_a_chain_can_accept(acc, rate):
    config, _, _ = run(LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, *CHAIN, acc=acc)
    assert config["acceptance_rate"] == pytest.approx(rate, abs=1e-9)


@pytest.mark.parametrize("argv, acc, says", [
    ((LLAMA, "--speculative-algorithm", "NGRAM"), "2", "emulated are EAGLE, EAGLE3, NEXTN"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3"), "2",
     "EAGLE3 needs --speculative-draft-model-path"),
    ((LLAMA, "--speculative-algorithm", "NEXTN", *CHAIN), "2",
     "has no multi-token-prediction layer"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, "--speculative-eagle-topk", "1"), "2",
     "need --speculative-num-steps"),
    ((LLAMA, "--speculative-algorithm", "EAGLE3", *DRAFT, "--speculative-num-steps", "5",
      "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"), "2",
     "tree drafts are not emulated"),
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
