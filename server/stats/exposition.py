"""The Prometheus text format (0.0.4) of the stats arrays, from a plan compiled once.

Why not prometheus_client's families: a scrape of one pod is ~550 samples, and building
`Metric`/`Sample` objects and escaping every label set on every scrape cost ~3.5 ms of the front
end's CPU, while the endpoint picker scrapes every 50 ms and the same CPU streams tokens. The
series a server exports are fixed once its engines have said hello (deployments, ranks,
layouts, label values), so every line up to its value is a string built here once; a scrape
gathers the values with NumPy (histogram buckets cumulated) and joins strings.

The output is what `prometheus_client.generate_latest` writes for the same families: HELP and
TYPE lines (counters as `NAME_total`), labels sorted by name and escaped as it escapes them,
histograms as `_bucket` lines (`le` by `floatToGoString`, `+Inf` last), `_count`, `_sum`, values
by `floatToGoString`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.utils import floatToGoString

from server.stats.layout import MetricDef

Labels = Sequence[tuple[str, str]]
# A value source: given the scrape's arrays, the vector the entry's lines print.
Source = Callable[["Scrape"], np.ndarray | None]


@dataclass
class Scrape:
    """One scrape's inputs: each (deployment, rank)'s request row and engine array (None while
    the engine is not up or not placed), and each deployment's engine arrays summed."""
    requests: np.ndarray
    engines: dict[tuple[int, int], np.ndarray | None]
    summed: dict[int, np.ndarray]


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_text(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels)) + "}"


@dataclass
class _Entry:
    prefixes: list[str]  # every line up to its value ("name{labels} ")
    source: Source


# --- LoRA (issue 13): series whose label values change at run time ---
@dataclass
class _Dynamic:
    """Lines computed at scrape time, labels and all (`vllm:lora_requests_info`: adapter names
    are label values). `lines(scrape)` gives (labels, value) pairs."""

    name: str
    lines: Callable[[Scrape], list[tuple[Labels, float]]]

    def render(self, scrape: Scrape) -> list[str]:
        return [f"{self.name}{label_text(labels)} {floatToGoString(v)}\n"
                for labels, v in self.lines(scrape)]


@dataclass
class Family:
    name: str
    kind: str
    help: str
    entries: list[_Entry | _Dynamic] = field(default_factory=list)

    @property
    def header(self) -> str:
        name = self.name + "_total" if self.kind == "counter" else self.name
        doc = self.help.replace("\\", r"\\").replace("\n", r"\n")
        return f"# HELP {name} {doc}\n# TYPE {name} {self.kind}\n"


class Exposition:
    """The plan: families in the order they were first added, each with its entries."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def family(self, name: str, kind: str, doc: str) -> Family:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = Family(name, kind, doc)
        return fam

    def add_def(self, d: MetricDef, labels: Labels, array: Callable[[Scrape], np.ndarray | None],
                at: int, sparse: bool = False) -> None:
        """Every series of `d` (per value of its extra label) read from `array(scrape)` at
        offset `at` of its layout. `sparse`: a series is absent until it has counted or
        observed something (prometheus_client's multiprocess mode writes a labelled series
        only once it is used: TensorRT-LLM's metrics)."""
        fam = self.family(d.name, d.kind, d.help)
        for i, extra in enumerate(d.values or (None,)):
            lv = [*labels, *([(d.label, extra)] if extra is not None else [])]
            if d.kind == "histogram":
                n = len(d.buckets) + 2
                base = at + i * n
                les = [floatToGoString(b) for b in d.buckets] + ["+Inf"]
                prefixes = [f"{d.name}_bucket{label_text([*lv, ('le', le)])} " for le in les]
                prefixes += [f"{d.name}_count{label_text(lv)} ", f"{d.name}_sum{label_text(lv)} "]
                source = _histogram(array, base, n)
                fam.entries.append(_Entry(prefixes, _used(source, -2) if sparse else source))
            else:
                name = d.name + "_total" if d.kind == "counter" else d.name
                source = _slot(array, at + i)
                fam.entries.append(_Entry([f"{name}{label_text(lv)} "],
                                          _used(source, 0) if sparse else source))

    def add_value(self, name: str, kind: str, doc: str, labels: Labels, source: Source) -> None:
        """One series whose value `source(scrape)` computes (a 1-vector, or None: absent)."""
        sample = name + "_total" if kind == "counter" else name
        self.family(name, kind, doc).entries.append(
            _Entry([f"{sample}{label_text(labels)} "], source))

    def add_dynamic(self, name: str, kind: str, doc: str,
                    lines: Callable[[Scrape], list[tuple[Labels, float]]]) -> None:
        """Series whose labels are known only at scrape time (see `_Dynamic`)."""
        self.family(name, kind, doc).entries.append(_Dynamic(name, lines))

    def render(self, scrape: Scrape) -> str:
        out: list[str] = []
        fmt: dict[float, str] = {}
        for fam in self.families.values():
            lines: list[str] = []
            for entry in fam.entries:
                if isinstance(entry, _Dynamic):
                    lines.extend(entry.render(scrape))
                    continue
                values = entry.source(scrape)
                if values is None:
                    continue
                for prefix, v in zip(entry.prefixes, values.tolist(), strict=True):
                    text = fmt.get(v)
                    if text is None:
                        text = fmt[v] = floatToGoString(v)
                    lines.append(prefix + text + "\n")
            if lines:
                out.append(fam.header)
                out.extend(lines)
        return "".join(out)


def _slot(array: Callable[[Scrape], np.ndarray | None], at: int) -> Source:
    def source(scrape: Scrape) -> np.ndarray | None:
        arr = array(scrape)
        return None if arr is None else arr[at:at + 1]
    return source


def _used(source: Source, at: int) -> Source:
    """`source`, absent while its value at `at` (a counter's, a histogram's count) is 0."""
    def used(scrape: Scrape) -> np.ndarray | None:
        values = source(scrape)
        return None if values is None or not values[at] else values
    return used


def _histogram(array: Callable[[Scrape], np.ndarray | None], base: int, n: int) -> Source:
    def source(scrape: Scrape) -> np.ndarray | None:
        arr = array(scrape)
        if arr is None:
            return None
        counts = np.cumsum(arr[base:base + n - 1])
        return np.concatenate((counts, counts[-1:], arr[base + n - 1:base + n]))
    return source
