"""`doppelchip sglang serve` takes SGLang 0.5.23's whole command line: every option of SGLang's
own parser (doppelchip/sglang_serve_flags.json, dumped from it by scripts/sglang_serve_flags.py)
parses with SGLang's strings, value shapes, types and choices, and each is translated, accepted
silently (loading, logging), refused with its reason, or accepted with a warning naming it —
never an argparse error for a flag SGLang takes, and still one for a flag it does not."""

from __future__ import annotations

import argparse

import pytest

from doppelchip import exit_codes
from doppelchip.cli import build_parser, main
from doppelchip.cmd_sglang import translate
from doppelchip.sglang_argv import sglang_argv
from doppelchip.sglang_flags import (
    ACCEPTED,
    BY_FLAG,
    REFUSED,
    SGLANG_OPTIONS,
    SGLANG_VERSION,
    SglangOption,
    human_readable_int,
)
from doppelchip.sglang_parser import TRANSLATED

REPO = "meta-llama/Llama-3.1-8B-Instruct"
EXTRAS = ("--chip", "--time-scale", "--cold")  # doppelchip's own flags
PARSER = build_parser("sglang")
SERVE = PARSER._subparsers._group_actions[0].choices["sglang"]._subparsers._group_actions[0] \
    .choices["serve"]


def parse(*argv: str) -> argparse.Namespace:
    return PARSER.parse_args(sglang_argv(["sglang", "serve", "--model-path", REPO, *argv]))


def given(option: SglangOption) -> list[str]:
    """`option` on a command line: a switch as itself, else with a value of its type."""
    if option.shape == "switch":
        return [option.name]
    value = {"int": "0", "float": "0.5", "human_readable_int": "1k"}.get(option.type, "x")
    return [option.name, option.choices[0] if option.choices else value]


def test_the_table_is_sglangs_whole_command_line():
    assert SGLANG_VERSION == "0.5.23" and len(SGLANG_OPTIONS) > 500
    named = [*TRANSLATED, *ACCEPTED, *REFUSED]
    assert len(named) == len(set(named))  # each list names an option once, and one list
    assert all(n in BY_FLAG and BY_FLAG[n].name == n for n in named), \
        [n for n in named if n not in BY_FLAG or BY_FLAG[n].name != n]
    assert BY_FLAG["--tp-size"].flags == ("--tp-size", "--tensor-parallel-size")
    assert BY_FLAG["--ep"].flags == ("--ep-size", "--expert-parallel-size", "--ep")


@pytest.mark.parametrize("option", SGLANG_OPTIONS, ids=[o.name for o in SGLANG_OPTIONS])
def test_every_sglang_option_parses_with_every_string_sglang_gives_it(option):
    if option.name == "--config":  # a YAML file, read before parsing (test_cli_sglang_serve)
        return
    for flag in option.flags:
        argv = [flag] if option.shape == "switch" else [flag, *given(option)[1:]]
        value = getattr(parse(*argv), option.dest)
        if option.shape == "switch":
            assert value is (flag not in option.negative), (flag, value)
        else:
            assert value is not None and value is not False, (flag, value)


def test_each_option_is_translated_accepted_refused_or_warned():
    for option in SGLANG_OPTIONS:
        if option.name in TRANSLATED or option.name == "--model-path":
            continue
        if option.name in REFUSED:
            with pytest.raises(ValueError, match=option.name):
                translate(parse(*given(option)))
            continue
        serve, warnings = translate(parse(*given(option)))
        if option.name in ACCEPTED:
            assert warnings == [] and option.name not in serve, option.name
            continue
        # options sharing a destination are named together: argparse cannot tell them apart
        names = "/".join(o.name for o in SGLANG_OPTIONS if o.dest == option.dest)
        assert warnings == [f"{names} is accepted but not emulated: it changes nothing here"], \
            (option.name, warnings)


def test_values_are_checked_as_sglang_checks_them(capsys):
    for argv in (["--tp-size", "two"], ["--attention-backend", "nope"],
                 ["--log-requests-level", "7"], ["--mem-fraction-static", "most"]):
        with pytest.raises(SystemExit) as exit_:
            parse(*argv)
        assert exit_.value.code == exit_codes.USAGE
        assert f"argument {argv[0]}" in capsys.readouterr().err
    assert parse("--log-requests-level", "2").log_requests_level == 2  # int choices
    assert parse("--no-enable-tf32-matmul").enable_tf32_matmul is False  # BooleanOptionalAction


def test_doppelchips_own_flags_change_no_sglang_abbreviation():
    """argparse takes a unique prefix of a flag (SGLang's `--tp 2`): an extra flag must not
    make a prefix that names one SGLang option ambiguous, nor take an SGLang destination."""
    flags = [f for o in SGLANG_OPTIONS for f in o.flags]
    for extra in EXTRAS:
        for end in range(3, len(extra) + 1):
            assert len([f for f in flags if f.startswith(extra[:end])]) != 1, extra[:end]
    dests = {o.dest for o in SGLANG_OPTIONS}
    assert not dests & {"chip", "time_scale", "cold", "command", "sglang_command", "func",
                        "unemulated"}
    assert all(any(s == e for a in SERVE._actions for s in a.option_strings) for e in EXTRAS)


def test_a_flag_sglang_does_not_define_is_argparses_error(capsys):
    for flag in ("--max-model-len", "--enable-prefix-caching", "--swap-space"):
        with pytest.raises(SystemExit) as exit_:
            main(["sglang", "serve", REPO, flag, "1"])
        assert exit_.value.code == exit_codes.USAGE
        assert "unrecognized arguments" in capsys.readouterr().err


def test_human_readable_integers_are_sglangs():
    assert [human_readable_int(v) for v in ("1k", "25.6k", "2M", "1Ki", "32Ki", "4096")] \
        == [1000, 25600, 2 * 10**6, 1024, 32768, 4096]
    for bad, says in (("1.5Ki", "Decimals are not allowed"), ("32K", "case-sensitive"),
                      ("auto", "Invalid integer value")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            human_readable_int(bad)
