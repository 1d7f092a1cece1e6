"""vLLM 0.34.0's speculative-decoding shorthands on `vllm serve`: `--spec-method`, `--spec-model`
and `--spec-tokens` fill `--speculative-config`'s `method`, `model` and
`num_speculative_tokens` (`EngineArgs.create_speculative_config`), and the pod decodes
speculatively with them; a key given both ways is vLLM's error."""

from __future__ import annotations

import json

import pytest

from doppelchip.cli import build_parser
from doppelchip.cmd_serve import pod_fleet
from doppelchip.cmd_vllm import translate
from doppelchip.dropin import serve_args
from doppelchip.vllm_argv import vllm_argv
from server.config import load_fleet

REPO = "meta-llama/Llama-3.1-8B-Instruct"
PARSER = build_parser("vllm")


def serve_of(*argv: str) -> list[str]:
    out, _ = translate(PARSER.parse_args(vllm_argv(["vllm", "serve", REPO, *argv], set())))
    return out


def config_of(serve: list[str]) -> dict:
    return json.loads(serve[serve.index("--speculative-config") + 1])


def test_the_spec_shorthands_fill_the_config():
    serve = serve_of("--spec-method", "eagle3", "--spec-tokens", "3", "--spec-model",
                     "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                     "--speculative-config", '{"acceptance_rate": 0.7}')
    assert config_of(serve) == {"acceptance_rate": 0.7, "method": "eagle3",
                                "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                "num_speculative_tokens": 3}
    deployment = pod_fleet(serve_args(serve), load_fleet(None)).deployments[0]
    spec = deployment.spec().speculative
    assert (spec.method, spec.num_speculative_tokens, spec.acceptance_rate) == ("eagle3", 3, 0.7)


def test_without_shorthands_the_config_passes_unchanged():
    text = '{"method": "mtp", "num_speculative_tokens": 1, "acceptance_rate": 0.8}'
    serve = serve_of("--speculative-config", text)
    assert serve[serve.index("--speculative-config") + 1] == text
    assert "--speculative-config" not in serve_of()


def test_a_key_given_both_ways_is_vllms_error():
    with pytest.raises(ValueError, match=r"--spec-tokens and --speculative-config\["
                                         r"'num_speculative_tokens'\] are mutually exclusive"):
        serve_of("--spec-tokens", "2", "--speculative-config",
                 '{"method": "eagle", "num_speculative_tokens": 4, "acceptance_rate": 0.5}')


def test_spec_tokens_is_an_integer_as_in_vllm():
    with pytest.raises(SystemExit):
        serve_of("--spec-tokens", "three")
