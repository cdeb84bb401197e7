"""Work-in-flight gauges of the python-backend models, on Triton's /metrics endpoint.

Triton counts executions per model, but a decoupled BLS model's `execute` returns long
before its work ends (a turn thread, a generation on the scheduler). These gauges say
what is still running, so that tests and operators can see cancelled work stop and
session state go away:

    avatar_active{model="avatar",what="turns"} 0
    avatar_active{model="llm",what="generations"} 0
    avatar_refused_total{model="avatar",reason="busy"} 3
    avatar_failures_total{model="llm",what="session_store"} 1

Imported only inside the python-backend stub.
"""

from __future__ import annotations

import threading

import triton_python_backend_utils as pb_utils

_LOCK = threading.Lock()
_FAMILIES: dict[str, object] = {}


def _family(name: str, description: str, kind) -> object:
    with _LOCK:  # one family per name per stub process
        if name not in _FAMILIES:
            _FAMILIES[name] = pb_utils.MetricFamily(name=name, description=description, kind=kind)
        return _FAMILIES[name]


class Gauge:
    """How many of `what` a model has in flight; thread-safe add/set."""

    def __init__(self, model: str, what: str):
        family = _family(
            "avatar_active",
            "Work in flight in a python-backend model (turns, generations, requests, sessions)",
            pb_utils.MetricFamily.GAUGE,
        )
        self._metric = family.Metric(labels={"model": model, "what": what})
        self._lock = threading.Lock()
        self._value = 0

    def add(self, delta: int) -> int:
        with self._lock:
            self._value += delta
            self._metric.set(float(self._value))
            return self._value

    def set(self, value: int) -> None:
        with self._lock:
            self._value = value
            self._metric.set(float(value))

    @property
    def value(self) -> int:
        return self._value


class _Counter:
    """One labelled series of a counter family; `increment()` adds one."""

    def __init__(self, name: str, description: str, labels: dict[str, str]):
        family = _family(name, description, pb_utils.MetricFamily.COUNTER)
        self._metric = family.Metric(labels=labels)

    def increment(self, value: float = 1.0) -> None:
        self._metric.increment(value)


class Counter(_Counter):
    """Requests a model refused (admission limits), by reason."""

    def __init__(self, model: str, reason: str):
        super().__init__(
            "avatar_refused_total",
            "Requests a python-backend model refused before starting work, by reason",
            {"model": model, "reason": reason},
        )


class Failures(_Counter):
    """Failures a model survived (the turn was still answered), by what failed."""

    def __init__(self, model: str, what: str):
        super().__init__(
            "avatar_failures_total",
            "Failures a python-backend model survived (the request was still answered)",
            {"model": model, "what": what},
        )


class PassCost:
    """What one kind of ASR pass (avatar.pipeline.priority.AsrPass) cost a model: passes,
    their audio seconds and the seconds of the model's executions they were served in
    (a batch's time split by the rows' audio), so that a benchmark can tell the live
    captions' cost from the passes a reply waits for:

        avatar_asr_passes_total{model="asr",pass="caption"} 12
        avatar_asr_pass_audio_seconds_total{model="asr",pass="caption"} 31.5
        avatar_asr_pass_seconds_total{model="asr",pass="caption"} 4.2
    """

    def __init__(self, model: str, kind: str):
        labels = {"model": model, "pass": kind}
        self.passes = _Counter("avatar_asr_passes_total", "ASR passes served, by kind", labels)
        self.audio = _Counter(
            "avatar_asr_pass_audio_seconds_total",
            "Audio seconds of the ASR passes, by kind",
            labels,
        )
        self.seconds = _Counter(
            "avatar_asr_pass_seconds_total",
            "Execution seconds of the ASR passes (a batch's split by audio), by kind",
            labels,
        )

    def add(self, audio_s: float, seconds: float) -> None:
        self.passes.increment()
        self.audio.increment(audio_s)
        self.seconds.increment(seconds)
