"""What one client may take of the gateway: connection caps (all, per address), and per
connection token buckets on messages, microphone audio and turns. Every refusal is a
protocol.RefusalError with its code; the gateway counts it on /metrics."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable

from gateway.protocol import RefusalError


@dataclasses.dataclass(frozen=True)
class Limits:
    max_connections: int = 200
    max_per_address: int = 8  # behind a proxy every client has its address: raise it there
    messages_per_s: float = 100.0  # the page sends ~31 MIC frames a second
    message_burst: int = 200
    # audio no faster than real time x audio_speed beyond a burst of audio_burst_s: a page
    # that stalled a moment catches up, a flood is cut
    audio_speed: float = 1.2
    audio_burst_s: float = 2.0
    turns_per_s: float = 0.5  # typed turns (each one starts the LLM)
    turn_burst: int = 5
    idle_timeout_s: float = 180.0  # nothing received and no reply playing
    bad_messages: int = 20  # protocol errors a connection may make before it is closed
    # per address, across its connections: new connections (a page reconnects rarely), and
    # audio (the connections' buckets together, so that reconnecting does not refill them)
    connects_per_s: float = 2.0
    connect_burst: int = 16


class TokenBucket:
    """`rate` units a second, at most `burst` saved up."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self._clock = rate, burst, clock
        self.level, self._at = float(burst), clock()

    def take(self, amount: float = 1.0) -> bool:
        now = self._clock()
        self.level = min(self.burst, self.level + (now - self._at) * self.rate)
        self._at = now
        if self.level < amount:
            return False
        self.level -= amount
        return True


@dataclasses.dataclass
class AddressBuckets:
    connects: TokenBucket
    audio: TokenBucket


class ConnectionCaps:
    """Open connections, all and per address, and each address's buckets (one object per
    gateway)."""

    MAX_ADDRESSES = 4096  # remembered addresses before the idle ones are forgotten

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self._clock = limits, clock
        self.by_address: Counter[str] = Counter()
        self.buckets: dict[str, AddressBuckets] = {}

    @property
    def open(self) -> int:
        return sum(self.by_address.values())

    def of(self, address: str) -> AddressBuckets:
        """The address's buckets: connections, and audio at the per-connection limit
        times the connections it may hold."""
        if address not in self.buckets:
            if len(self.buckets) >= self.MAX_ADDRESSES:
                self._forget_idle()
            limits, n = self.limits, self.limits.max_per_address
            self.buckets[address] = AddressBuckets(
                TokenBucket(limits.connects_per_s, limits.connect_burst, self._clock),
                TokenBucket(limits.audio_speed * n, limits.audio_burst_s * n, self._clock),
            )
        return self.buckets[address]

    def _forget_idle(self) -> None:
        for address in [a for a in self.buckets if not self.by_address[a]]:
            del self.buckets[address]

    def acquire(self, address: str) -> None:
        if self.open >= self.limits.max_connections:
            raise RefusalError("too_many_connections", "the gateway is full: try later", close=True)
        if self.by_address[address] >= self.limits.max_per_address:
            raise RefusalError(
                "too_many_connections", "too many connections from this address", close=True
            )
        if not self.of(address).connects.take():
            raise RefusalError(
                "rate_limited", "new connections from this address too fast", close=True
            )
        self.by_address[address] += 1

    def release(self, address: str) -> None:
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]


class ConnectionLimits:
    """One connection's buckets (and its address's audio, `shared_audio`); each method
    raises RefusalError when its limit is passed."""

    def __init__(
        self,
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
        shared_audio: TokenBucket | None = None,
    ) -> None:
        self.limits, self.shared_audio = limits, shared_audio
        self.messages = TokenBucket(limits.messages_per_s, limits.message_burst, clock)
        self.audio = TokenBucket(limits.audio_speed, limits.audio_burst_s, clock)
        self.turns = TokenBucket(limits.turns_per_s, limits.turn_burst, clock)
        self.bad = 0

    def message(self) -> None:
        if not self.messages.take():
            limit = self.limits.messages_per_s
            raise RefusalError("rate_limited", f"more than {limit:g} messages a second", close=True)

    def audio_seconds(self, seconds: float) -> None:
        shared = self.shared_audio
        if not self.audio.take(seconds) or (shared is not None and not shared.take(seconds)):
            speed = self.limits.audio_speed
            raise RefusalError(
                "rate_limited", f"microphone audio faster than {speed:g}x real time", close=True
            )

    def turn(self) -> None:
        if not self.turns.take():
            raise RefusalError("rate_limited", "typed turns too fast: this one is dropped")

    def bad_message(self) -> None:
        self.bad += 1
        if self.bad > self.limits.bad_messages:
            raise RefusalError("bad_request", "too many bad messages", close=True)
