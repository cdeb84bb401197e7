"""Prefix cache: KV caches of token prefixes (system prompts, earlier turns) reused by
later prompts that start with the same tokens."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from avatar.llm.decoder import Past


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def truncate(past: Past, length: int) -> Past:
    """The first `length` positions of a single-row past ([1, H, P, D] each)."""
    return [p[:, :, :length, :] for p in past]


class PrefixCache:
    """LRU map of token prefixes -> their KV cache ([1, H, len, D] per tensor), thread-safe.

    `lookup(ids)` finds the entry sharing the longest prefix with `ids` and returns that
    many positions of its cache (a KV cache of n tokens is valid for any prefix of them).
    """

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, ...], Past] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def put(self, ids: Sequence[int], past: Past) -> None:
        """Keep the KV of `ids`. An entry that is a prefix of another serves no lookup the
        longer one does not: the shorter is dropped (a prompt cached when its generation
        started, once the generation's whole conversation is put at its end)."""
        key = tuple(ids)
        with self._lock:
            for other in list(self._entries):
                if len(other) >= len(key) and other[: len(key)] == key:
                    self._entries.move_to_end(other)  # it already holds `ids`
                    return
                if other == key[: len(other)]:
                    del self._entries[other]
            self._entries[key] = [p[:, :, : len(key), :] for p in past]
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def lookup(self, ids: Sequence[int], keep_last: int = 1) -> tuple[int, Past | None]:
        """(n, past of the first n ids) for the best entry, n <= len(ids) - keep_last so that
        at least `keep_last` ids are left to run; (0, None) when nothing matches."""
        best, best_key = 0, None
        with self._lock:
            for key in self._entries:
                n = min(common_prefix(key, ids), len(ids) - keep_last)
                if n > best:
                    best, best_key = n, key
            if best_key is None:
                self.misses += 1
                return 0, None
            self._entries.move_to_end(best_key)
            self.hits += 1
            return best, truncate(self._entries[best_key], best)

    def __len__(self) -> int:
        return len(self._entries)
