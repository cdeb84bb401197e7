"""What one client may take of the gateway: connection caps (all, per address, and those
that have not started talking), the sessions the machine can answer at once, and per
connection token buckets on messages, microphone audio and turns. Every refusal is a
protocol.RefusalError with its code; the gateway counts it on /metrics.

The buckets judge what the client did, never when the gateway got round to reading it: a
connection starts with `burst` and earns `rate` a second of wall time from the moment it
opened, saved up to `backlog` (not `burst`). A client at or under the rate has earned what
it sent whenever the gateway reads it, however late (a loop that stalled, a model that was
slow), as long as the gateway is less than `backlog` seconds behind; a flood passes only
its starting `burst`."""

from __future__ import annotations

import dataclasses
import os
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
    # audio no faster than real time x audio_speed, judged since the connection opened: a
    # connection starts with audio_burst_s (a flood is cut after that much), and what it
    # earns at audio_speed and does not send is saved up to backlog_s seconds' worth, so
    # that a gateway which reads late (its loop stalled, Triton slow) never refuses a client
    # that sent at real time (4 sessions on 2 cores: 5-15 of 16 turns refused with a 2-s
    # cap on the earned audio; issue 41)
    audio_speed: float = 1.2
    audio_burst_s: float = 2.0
    backlog_s: float = 60.0  # how far behind the gateway may read an honest client
    turns_per_s: float = 0.5  # typed turns (each one starts the LLM)
    turn_burst: int = 5
    idle_timeout_s: float = 180.0  # no application message and no reply playing
    # a connection that has sent no message this long after it opened is closed, and such
    # connections may hold at most quiet_share of max_connections: sockets that never say a
    # word cannot fill the gateway (199 of them from 26 addresses did; issue 42)
    first_message_s: float = 10.0
    quiet_share: float = 0.25
    heartbeat_s: float = 20.0  # WebSocket pings: a dead peer is found (pongs are not messages)
    # sessions answered at once (None: the machine's measured figure, default_capacity());
    # one more is told `busy` when it connects; one admitted is never cut off for load
    max_sessions: int | None = None
    retry_after_s: float = 10.0  # the `busy` answer's retry hint
    bad_messages: int = 20  # protocol errors a connection may make before it is closed
    # per address, across its connections: new connections (a page reconnects rarely), and
    # audio (the connections' buckets together, so that reconnecting does not refill them)
    connects_per_s: float = 2.0
    connect_burst: int = 16


# Sessions admitted per core by default: python -m perf capacity on this project's 2-core
# machine (docs/performance.md section 24): 4 sessions at once answered in 1.46 / 2.64 s
# (first audio p50 / p95) and none refused, 6 in 1.67 / 2.96 s; the floor is 4
SESSIONS_PER_CORE = 2
MIN_SESSIONS = 4


def default_capacity(cores: int | None = None) -> int:
    """The machine's sessions at once: SESSIONS_PER_CORE per core, at least MIN_SESSIONS."""
    cores = cores or os.cpu_count() or 1
    return max(MIN_SESSIONS, SESSIONS_PER_CORE * cores)


class TokenBucket:
    """`rate` units a second; it starts with `burst` and saves up to `cap` (default:
    `burst`)."""

    def __init__(
        self,
        rate: float,
        burst: float,
        clock: Callable[[], float] = time.monotonic,
        cap: float | None = None,
    ):
        self.rate, self.burst, self._clock = rate, burst, clock
        self.cap = float(burst if cap is None else max(cap, burst))
        self.level, self._at = float(burst), clock()

    def take(self, amount: float = 1.0) -> bool:
        now = self._clock()
        self.level = min(self.cap, self.level + (now - self._at) * self.rate)
        self._at = now
        if self.level < amount:
            return False
        self.level -= amount
        return True


@dataclasses.dataclass
class AddressBuckets:
    connects: TokenBucket
    audio: TokenBucket


@dataclasses.dataclass(eq=False)
class Slot:
    """One open connection's hold on the caps: `quiet` until its first message. `evict`
    (set by the gateway) closes the connection when a newer one needs its quiet slot."""

    address: str
    quiet: bool = True
    admitted: bool = False  # a session of the capacity (ConnectionCaps.admit_session)
    released: bool = False
    evict: Callable[[], None] = lambda: None


class ConnectionCaps:
    """Open connections, all, per address and those not yet talking; the sessions being
    answered; and each address's buckets (one object per gateway).

    Quiet connections (no message yet) may hold at most `max_quiet` slots; when a new one
    needs a slot and they hold them all, the oldest quiet connection of the address that
    holds the most is closed to make room: idle sockets cannot fill the gateway, and they
    cannot keep a new user out either."""

    MAX_ADDRESSES = 4096  # remembered addresses before the idle ones are forgotten

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self._clock = limits, clock
        self.by_address: Counter[str] = Counter()
        self.buckets: dict[str, AddressBuckets] = {}
        self._quiet: dict[int, Slot] = {}  # by id, oldest first
        self.evicted = 0
        self.sessions = 0  # admitted sessions (see admit_session)
        self.capacity = limits.max_sessions or default_capacity()

    @property
    def open(self) -> int:
        return sum(self.by_address.values())

    @property
    def quiet(self) -> int:
        return len(self._quiet)

    @property
    def max_quiet(self) -> int:
        limits = self.limits  # never fewer than one address may hold
        return max(limits.max_per_address, int(limits.max_connections * limits.quiet_share))

    def of(self, address: str) -> AddressBuckets:
        """The address's buckets: connections, and audio at the per-connection limit
        times the connections it may hold."""
        if address not in self.buckets:
            if len(self.buckets) >= self.MAX_ADDRESSES:
                self._forget_idle()
            limits, n = self.limits, self.limits.max_per_address
            self.buckets[address] = AddressBuckets(
                TokenBucket(limits.connects_per_s, limits.connect_burst, self._clock),
                TokenBucket(
                    limits.audio_speed * n,
                    limits.audio_burst_s * n,
                    self._clock,
                    cap=limits.audio_speed * limits.backlog_s * n,
                ),
            )
        return self.buckets[address]

    def _forget_idle(self) -> None:
        for address in [a for a in self.buckets if not self.by_address[a]]:
            del self.buckets[address]

    def acquire(self, address: str) -> Slot:
        """A new (quiet) connection from `address`; RefusalError when a cap is reached.
        Every slot acquired is given back once with `release`."""
        if self.by_address[address] >= self.limits.max_per_address:
            raise RefusalError(
                "too_many_connections", "too many connections from this address", close=True
            )
        if not self.of(address).connects.take():
            raise RefusalError(
                "rate_limited", "new connections from this address too fast", close=True
            )
        full = self.open >= self.limits.max_connections
        if (full or self.quiet >= self.max_quiet) and not self._evict_quiet():
            raise RefusalError("too_many_connections", "the gateway is full: try later", close=True)
        self.by_address[address] += 1
        slot = Slot(address)
        self._quiet[id(slot)] = slot
        return slot

    def _evict_quiet(self) -> bool:
        """Close the oldest quiet connection of the address with the most (False: none).
        Its slot is free at once; its connection ends on its own loop turn."""
        if not self._quiet:
            return False
        counts = Counter(slot.address for slot in self._quiet.values())
        most = max(counts.values())
        victim = next(s for s in self._quiet.values() if counts[s.address] == most)
        self.release(victim)
        victim.evict()
        self.evicted += 1
        return True

    def talked(self, slot: Slot) -> None:
        """The connection sent its first message: no longer quiet."""
        slot.quiet = False
        self._quiet.pop(id(slot), None)

    def release(self, slot: Slot) -> None:
        """The connection ended (or was evicted): its slot and session are free. Twice is
        once."""
        if slot.released:
            return
        slot.released = True
        if slot.admitted:
            slot.admitted = False
            self.sessions -= 1
        self._quiet.pop(id(slot), None)
        self.by_address[slot.address] -= 1
        if self.by_address[slot.address] <= 0:
            del self.by_address[slot.address]

    def admit_session(self, slot: Slot) -> None:
        """A session to answer, or RefusalError(busy) when the machine answers `capacity`
        already: told at connection, never later."""
        if slot.admitted:
            return
        if self.sessions >= self.capacity:
            raise RefusalError(
                "busy",
                f"the avatar is answering {self.capacity} sessions, its capacity: try again "
                f"in {self.limits.retry_after_s:g} s",
                close=True,
                retry_after_s=self.limits.retry_after_s,
            )
        self.sessions += 1
        slot.admitted = True


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
        backlog = limits.backlog_s
        self.messages = TokenBucket(
            limits.messages_per_s, limits.message_burst, clock, cap=limits.messages_per_s * backlog
        )
        self.audio = TokenBucket(
            limits.audio_speed, limits.audio_burst_s, clock, cap=limits.audio_speed * backlog
        )
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
        """A message the gateway could not serve (the client's mistake, or an unexpected
        failure on it): counted, and the connection closed after too many."""
        self.bad += 1
        if self.bad > self.limits.bad_messages:
            raise RefusalError("bad_request", "too many bad messages", close=True)
