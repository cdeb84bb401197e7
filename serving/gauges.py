"""The python-backend models' own gauges on tritonserver's /metrics (avatar.triton.metrics):
read by the server's drain before a stop, and by perf's probes and the reliability tests."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Sequence

Sample = tuple[str, tuple[tuple[str, str], ...]]  # (name, sorted labels)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metrics(
    url: str, names: Sequence[str] = ("avatar_active", "avatar_refused_total"), timeout: float = 5
) -> dict[Sample, float]:
    """Prometheus text from `url` -> {(name, (("label", "value"), ...)): value} for `names`."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        text = reply.read().decode("utf-8", errors="replace")
    values: dict[Sample, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in names:
            labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
            values[(match.group(1), labels)] = float(match.group(3))
    return values


def gauge(values: dict[Sample, float], model: str, what: str) -> float:
    """avatar_active{model=..., what=...} from `metrics()` (0 when not reported yet)."""
    return values.get(("avatar_active", (("model", model), ("what", what))), 0.0)
