"""Generated token ids -> streamed text: incremental detokenising, stop strings, and
sentence boundaries (so that TTS can start on the first sentence)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "e.g", "i.e"}
    | {"a.m", "p.m", "no", "approx", "dept", "inc", "ltd", "co"}
)
_END = re.compile(r"([.!?…]+[\"')\]]*)(\s+)|(\n+)")


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A piece of streamed text; `sentence` is set when the piece ends a sentence."""

    text: str
    sentence: str | None = None


class SentenceSplitter:
    """Accumulates text and cuts it after sentence-ending punctuation followed by
    whitespace (or at line breaks), not after abbreviations, initials or in numbers."""

    def __init__(self) -> None:
        self._pending = ""  # text of the current, unfinished sentence

    def push(self, text: str) -> list[Chunk]:
        """Split `text` into chunks; each ends either a sentence or the given text."""
        chunks = []
        shown = len(self._pending)  # characters of the pending sentence already streamed
        self._pending += text
        while (cut := self._boundary(self._pending)) is not None:
            chunks.append(Chunk(self._pending[shown:cut], self._pending[:cut].strip()))
            self._pending = self._pending[cut:]
            shown = max(0, shown - cut)
        if len(self._pending) > shown:
            chunks.append(Chunk(self._pending[shown:]))
        return chunks

    def _boundary(self, buffer: str) -> int | None:
        for match in _END.finditer(buffer):
            if buffer[: match.end()].strip() and self._is_boundary(buffer, match):
                return match.end()
        return None

    @staticmethod
    def _is_boundary(buffer: str, match: re.Match) -> bool:
        if match.group(3):  # line break
            return True
        before = buffer[: match.start()].split()
        word = before[-1].lower().rstrip(".") if before else ""
        return not (match.group(1).startswith(".") and (word in ABBREVIATIONS or len(word) == 1))

    def flush(self) -> str | None:
        """The unfinished last sentence (at the end of generation), if any."""
        sentence, self._pending = self._pending.strip(), ""
        return sentence or None


class TextStream:
    """Turns generated ids into safe-to-show text deltas and watches for stop strings.

    Text is held back while it ends in an incomplete UTF-8 sequence (decoded as U+FFFD) or
    in a prefix of a stop string; a stop string ends the stream and is not shown.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self._decode, self._stop = decode, tuple(stop)
        self._ids: list[int] = []
        self._shown = 0
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one generated id; return the new text that can be shown (maybe "")."""
        self._ids.append(token)
        text = self._decode(self._ids)
        for stop in self._stop:
            at = text.find(stop)
            if at >= 0:
                self.stopped = True
                return self._emit(text[:at])
        safe = len(text)
        if text.endswith("\ufffd"):
            safe = len(text.rstrip("\ufffd"))
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    safe = min(safe, len(text) - k)
                    break
        return self._emit(text[:safe])

    def finish(self) -> str:
        """Whatever was held back, at the end of generation (unless a stop string hit)."""
        if self.stopped:
            return ""
        return self._emit(self._decode(self._ids).rstrip("\ufffd"))

    def _emit(self, text: str) -> str:
        delta = text[self._shown :] if len(text) > self._shown else ""
        self._shown = max(self._shown, len(text))
        return delta
