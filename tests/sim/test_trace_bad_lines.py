"""A trace line that cannot be replayed is an error naming its file and line — never a hang
(a NaN or infinite timestamp once spun the virtual clock for ever) nor a NumPy message."""

from __future__ import annotations

import pytest

from clients.trace import load_trace
from doppelchip.cli import main

VOCAB = 32000
OK = '{"timestamp": 0, "input_length": 8, "max_tokens": 2}'


@pytest.mark.parametrize(("line", "says"), [
    ('{"timestamp": NaN, "input_length": 8, "max_tokens": 2}', "timestamp must be a finite"),
    ('{"timestamp": 1e400, "input_length": 8, "max_tokens": 2}', "timestamp must be a finite"),
    ('{"timestamp": "3", "input_length": 8, "max_tokens": 2}', "timestamp must be a finite"),
    ('{"timestamp": 1, "input_length": -5, "max_tokens": 2}', "input_length must be an integer"),
    ('{"timestamp": 1, "input_length": 2.5, "max_tokens": 2}', "input_length must be an integer"),
    ('{"timestamp": 1, "prompt_token_ids": [1, "x"], "max_tokens": 2}', "prompt_token_ids"),
    ('{"timestamp": 1, "input_length": 8, "max_tokens": 2, "seed": -1}', "seed must be"),
    ('[1, 2]', "must be a JSON object"),
])
def test_a_bad_line_names_itself(tmp_path, line, says):
    path = tmp_path / "t.jsonl"
    path.write_text(f"{OK}\n{line}\n")
    with pytest.raises(ValueError, match=says) as e:
        load_trace(path, VOCAB, trace_format="jsonl")
    assert f"{path}:2" in str(e.value)


@pytest.mark.parametrize(("fmt", "text"), [
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "nan,ChatGPT,10,5,15,Conversation log\n"),
    ("mooncake", '{"timestamp": NaN, "input_length": 8, "output_length": 2, "hash_ids": [1]}\n'),
])
def test_public_formats_refuse_a_timestamp_that_is_not_finite(tmp_path, fmt, text):
    path = tmp_path / "t.trace"
    path.write_text(text)
    with pytest.raises(ValueError, match="imestamp"):
        load_trace(path, VOCAB, trace_format=fmt)


def test_simulate_answers_a_nan_timestamp_with_exit_2(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": NaN, "input_length": 8, "max_tokens": 2}\n')
    assert main(["simulate", "--workload", "trace", "--trace", str(path)]) == 2
    assert "timestamp must be a finite number" in capsys.readouterr().err
