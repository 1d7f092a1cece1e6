"""An SGLang pod's metric definitions against SGLang 0.5.23's source (transcribed into
sglang_reference.json): every family it exports has SGLang's name, type, help string, extra
label and buckets, and the tokenizer's and scheduler's families carry their own label sets."""

from __future__ import annotations

import json
from pathlib import Path

from server.stats.collector_sglang import scheduler_labels, tokenizer_labels
from server.stats.schema_sglang import (
    SCHEDULER_FAMILIES,
    SCHEDULER_SERIES,
    SGLANG_REQUEST_METRICS,
)

REF = json.loads((Path(__file__).parent / "sglang_reference.json").read_text())


def exported() -> dict[str, dict]:
    """Every family an SGLang pod exports, as the reference names it (counters `_total`)."""
    out = {}
    for d in SGLANG_REQUEST_METRICS:
        name = d.name + "_total" if d.kind == "counter" else d.name
        out[name] = {"type": d.kind, "help": d.help, "extra_labels": [d.label] if d.label
                     else [], "buckets": list(d.buckets) or None}
    for name, (kind, doc) in SCHEDULER_SERIES.items():
        full = name + "_total" if kind == "counter" else name
        out[full] = {"type": kind, "help": doc, "extra_labels": [], "buckets": None}
    return out


def test_every_family_is_sglangs():
    ours = exported()
    assert set(ours) == set(REF["families"])
    for name, family in REF["families"].items():
        assert ours[name]["type"] == family["type"], name
        assert ours[name]["help"] == family["help"], name
        assert ours[name]["extra_labels"] == family["extra_labels"], name
        if family["buckets"] is not None:
            assert ours[name]["buckets"] == [float(b) for b in family["buckets"]], name


def test_families_are_the_scheduler_s_or_the_tokenizer_s():
    ours = {n.removesuffix("_total") for n in REF["scheduler_families"]}
    assert ours == set(SCHEDULER_FAMILIES)


class Info:  # the DeploymentInfo fields the label sets read
    model_name, data_parallel_size, dp_rank = "m", 1, 0


def test_label_sets():
    assert [k for k, _ in tokenizer_labels(Info())] == REF["tokenizer_labels"]
    assert [k for k, _ in scheduler_labels(Info())] == REF["scheduler_labels"]
    two = Info()
    two.data_parallel_size, two.dp_rank = 2, 1
    assert scheduler_labels(two)[-1] == ("dp_rank", "1")
