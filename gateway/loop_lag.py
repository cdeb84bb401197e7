"""How late the gateway's event loop runs: a timer asks to wake every `interval_s` and
records how much later it woke. Everything the edge does (reading microphone audio,
barge-in, captions, pings) waits that long on top of its own work; /metrics shows the
recent quantiles and the largest lag (`python -m perf capacity` reads them per level)."""

from __future__ import annotations

import asyncio
import collections
import time

import numpy as np


class LoopLag:
    """One per gateway: `start()` on its loop, `stop()` at shutdown."""

    def __init__(self, interval_s: float = 0.1, keep: int = 3000) -> None:
        self.interval_s = interval_s
        self.lags: collections.deque[float] = collections.deque(maxlen=keep)  # ~5 min
        self.max_s = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        self._schedule(asyncio.get_running_loop())

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = time.monotonic() + self.interval_s
        self._handle = loop.call_later(self.interval_s, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        lag = max(0.0, time.monotonic() - self._due)
        self.lags.append(lag)
        self.max_s = max(self.max_s, lag)
        self._schedule(loop)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def quantiles(self, qs: tuple[float, ...] = (0.5, 0.99)) -> dict[float, float]:
        """{q: lag in seconds} over the recent ticks (0 before the first)."""
        if not self.lags:
            return dict.fromkeys(qs, 0.0)
        values = np.quantile(np.fromiter(self.lags, float), qs)
        return {q: float(v) for q, v in zip(qs, values, strict=True)}
