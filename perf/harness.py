"""The served-benchmark harness every `python -m perf` command runs on.

- `serve(url, models, configure=...)`: attach to a running server, or materialise the
  embedded repository of `models`, let `configure` rewrite it (a batching point, a
  capacity, setting copies), start tritonserver and stop it at the end;
- `warm_up(send, requests)`: untimed first calls (ONNX Runtime's first runs, caches);
- `at_concurrency(streams, requests, send)`: `streams` clients share the requests, each
  sending its share back to back; every request's latency, result or error is a `Sample`;
- `Latency.of(seconds)`: the median and p95 of samples, as every benchmark reports them;
  `playback(arrivals)`: how many pieces of audio come late for a player starting at the
  first one, and how long it waits for them in all (`playback_stall`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:
    from serving.server import EmbeddedServer

log = logging.getLogger(__name__)

R = TypeVar("R")  # a request of a workload
T = TypeVar("T")  # what sending it returns


@dataclasses.dataclass(frozen=True)
class Target:
    """The server a benchmark measures: attached by address, or started here."""

    grpc_url: str
    metrics_url: str = ""  # "" when attached without one
    server: EmbeddedServer | None = None  # the server started here, None when attached


@contextlib.contextmanager
def serve(
    url: str | None = None,
    models: Sequence[str] = (),
    *,
    configure: Callable[[Path], None] | None = None,
    metrics_url: str = "",
    heal: bool = False,
) -> Iterator[Target]:
    """`url` (with its `metrics_url`), or an embedded server of `models` (default: every
    model; the public ones call the others through BLS and ensembles), its repository
    materialised into a temporary folder and passed to `configure` before the start."""
    if url is not None:
        yield Target(url, metrics_url)
        return
    from serving.deployment import build_repository
    from serving.server import EmbeddedServer, ServerOptions

    with tempfile.TemporaryDirectory(prefix="perf-") as tmp:
        repository = Path(tmp) / "repository"
        build_repository(repository, "embedded", models or None)
        if configure is not None:
            configure(repository)
        options = ServerOptions(repository, models=models, startup_timeout_s=600, heal=heal)
        with EmbeddedServer(options) as server:
            yield Target(server.grpc_url, server.metrics_url, server)


@dataclasses.dataclass
class Sample(Generic[R, T]):
    """One request of a workload as its client saw it."""

    request: R
    stream: int
    seconds: float
    result: T | None = None
    error: str = ""  # "" when sent and answered; the exception otherwise


@dataclasses.dataclass
class Load(Generic[R, T]):
    """A workload's samples at `streams` concurrent clients, in the order they ended."""

    streams: int
    samples: list[Sample[R, T]]
    wall_s: float

    @property
    def errors(self) -> list[Sample[R, T]]:
        return [s for s in self.samples if s.error]

    @property
    def per_s(self) -> float:
        return len(self.samples) / self.wall_s if self.wall_s else 0.0

    def latency(self) -> Latency:
        return Latency.of([s.seconds for s in self.samples if not s.error])


@dataclasses.dataclass(frozen=True)
class Latency:
    """Samples summarised: how many, median and p95 (seconds)."""

    count: int
    median_s: float
    p95_s: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        return cls(len(seconds), percentile(seconds, 50), percentile(seconds, 95))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (numpy's linear interpolation); NaN without values."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def concurrently(target: Callable[[int], None], count: int, *, daemon: bool = False) -> float:
    """`target(0)` .. `target(count - 1)` each in its own thread; seconds until all ended."""
    started = time.monotonic()
    threads = [threading.Thread(target=target, args=(i,), daemon=daemon) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def at_concurrency(streams: int, requests: Sequence[R], send: Callable[[R], T]) -> Load[R, T]:
    """Client c sends requests[c], requests[c + streams], ... one after another; a request
    that raises is a sample with its error (logged), and the workload goes on."""
    samples: list[Sample[R, T]] = []
    lock = threading.Lock()

    def client(stream: int) -> None:
        for request in requests[stream::streams]:
            sample: Sample[R, T] = Sample(request, stream, 0.0)
            started = time.perf_counter()
            try:
                sample.result = send(request)
            except Exception as error:  # a failed request is a figure, not the end
                sample.error = f"{type(error).__name__}: {error}"
                log.warning("stream %d: %s", stream, sample.error)
            sample.seconds = time.perf_counter() - started
            with lock:
                samples.append(sample)

    wall_s = concurrently(client, streams)
    return Load(streams, samples, wall_s)


@dataclasses.dataclass(frozen=True)
class Playback:
    """A reply as a player that starts at its first audio hears it."""

    late: int  # pieces that arrived after the time they were due to play
    stall_s: float  # seconds the player waited for them, in all


def playback(arrivals: Iterable[tuple[float, float]]) -> Playback:
    """A player starts at the first piece's arrival and plays each piece (arrival s, start
    on the turn clock s) at its start, pausing until a late one arrives (so one late
    sentence is one late piece, not every piece after it)."""
    pieces = sorted(arrivals, key=lambda piece: piece[1])
    if not pieces:
        return Playback(0, 0.0)
    t0, waited, late = min(at for at, _ in pieces), 0.0, 0
    for at, start in pieces:
        wait = max(0.0, at - (t0 + waited + start))
        late += wait > 0
        waited += wait
    return Playback(late, waited)


def playback_stall(arrivals: Iterable[tuple[float, float]]) -> float:
    """Seconds a player waits in all for late audio (`playback`)."""
    return playback(arrivals).stall_s


def warm_up(send: Callable[[R], Any], requests: Sequence[R]) -> None:
    """Each request once, untimed; a failure is logged (the measured run reports it)."""
    load = at_concurrency(1, requests, send)
    for sample in load.errors:
        log.warning("warm-up: %s", sample.error)
