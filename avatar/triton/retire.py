"""Keeps finished BLS response iterators alive until the stub's helper thread let go of them.

Why (Triton 2.51 / python_backend r24.10, read in its source): a decoupled BLS call's
`ResponseIterator` is owned twice, by the Python caller and by the stub's
`response_iterator_map_` (src/pb_stub.cc, `GetResponseIterator`). On the final response
`ResponseIterator::Clear()` (src/pb_response_iterator.cc) queues a cleanup that the
stub's helper thread runs later (`Stub::ServiceStubToParentRequests` ->
`SendCleanupId`, which erases the map entry). When the Python caller has already dropped
its reference, that erase runs the iterator's destructor on the helper thread, which
holds no GIL: every response and tensor it kept is destroyed there, and `~PbTensor`
releases its numpy arrays without the GIL (fixed upstream in python_backend PR #390,
r25.01). Concurrent turn threads then corrupt the allocator's free lists: glibc aborts the
stub with "double free or corruption (fasttop)" or "malloc(): unaligned tcache chunk
detected" (tests/test_bls_lifetime.py reproduces it in seconds).

The helper thread serves its queue in order, and `request.is_cancelled()` is a
synchronous round trip through that same queue (src/pb_cancel.cc). So an iterator
retired before such a round trip began is no longer in the map once it returns; dropping
it then, from a Python thread, destroys it with the GIL held. Not every call is a round
trip: `PbCancel::IsCancelled` answers a request already known cancelled from its cache,
and a second caller of the same request waits for the first one's answer. So round trips
run one at a time (`_serial`) and only a False answer (asked of the parent) counts.
Without round trips an iterator is released after `max_age_s`, far beyond the
microseconds the helper needs.

Triton-free: unit-tested with plain objects and a fake clock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any


class Retirement:
    """Holds objects until a helper-thread round trip that began after they were retired
    has completed (`synced`), or until they are `max_age_s` old."""

    def __init__(
        self, max_age_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._held: deque[tuple[float, Any]] = deque()
        self._synced_at = float("-inf")
        self._serial = threading.Lock()  # one round trip at a time: none rides on another

    def keep(self, item: Any) -> None:
        """Hold `item` (the caller drops its own reference afterwards)."""
        now = self._clock()
        with self._lock:
            self._held.append((now, item))
        self.release()

    def round_trip(self, call: Callable[[], Any]) -> Any:
        """Run a synchronous helper-thread round trip (e.g. `request.is_cancelled`) and
        record that everything retired before it started may now be dropped."""
        with self._serial:
            started = self._clock()
            result = call()
        if result is False:  # a True may come from the stub's cache, not the helper
            with self._lock:
                self._synced_at = max(self._synced_at, started)
        self.release()
        return result

    def release(self) -> int:
        """Drop what may be dropped; returns how many. Runs on the calling Python thread,
        so the objects are destroyed with the GIL held."""
        now = self._clock()
        dropped = []
        with self._lock:
            while self._held:
                retired, _ = self._held[0]
                if retired < self._synced_at or now - retired >= self.max_age_s:
                    dropped.append(self._held.popleft())
                else:
                    break
        count = len(dropped)
        del dropped  # destroyed here, outside the lock
        return count

    def __len__(self) -> int:
        return len(self._held)
