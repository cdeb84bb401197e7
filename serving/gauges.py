"""The python-backend models' own gauges on tritonserver's /metrics (avatar.triton.metrics):
read by the server's drain before a stop, and by perf's probes, its turn cost and the
reliability tests."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Sequence

Sample = tuple[str, tuple[tuple[str, str], ...]]  # (name, sorted labels)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str, names: Sequence[str] | None = None) -> dict[Sample, float]:
    """Prometheus text -> {(name, (("label", "value"), ...)): value} for `names` (None:
    every series)."""
    values: dict[Sample, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and (names is None or match.group(1) in names):
            labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
            values[(match.group(1), labels)] = float(match.group(3))
    return values


def metrics(
    url: str,
    names: Sequence[str] | None = ("avatar_active", "avatar_refused_total"),
    timeout: float = 5,
) -> dict[Sample, float]:
    """parse() of the Prometheus text at `url`."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return parse(reply.read().decode("utf-8", errors="replace"), names)


def gauge(values: dict[Sample, float], model: str, what: str) -> float:
    """avatar_active{model=..., what=...} from `metrics()` (0 when not reported yet)."""
    return values.get(("avatar_active", (("model", model), ("what", what))), 0.0)


def summed_by(values: dict[Sample, float], name: str, key: str = "model") -> dict[str, float]:
    """The series of metric `name` summed by their `key` label (e.g. per model)."""
    out: dict[str, float] = {}
    for (series, labels), value in values.items():
        label = dict(labels).get(key)
        if series == name and label is not None:
            out[label] = out.get(label, 0.0) + value
    return out
