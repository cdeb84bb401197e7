"""The moderated queue of the audience's questions: what the anchor answers next.

`ChatQueue.offer` judges each chat message and answers a `Verdict` (a code of `REASONS`):

1. the text is cleaned (`text.clean`: IRC formatting, control and zero-width characters
   gone) and the limits apply to what is left: empty, too long;
2. the blocklist: blocked viewers (by account, case-insensitive) and blocked words or
   phrases, matched as whole words after folding case and accents ("Café" blocks "cafe");
3. a question the anchor has just answered, or the operator skipped, is not asked again
   within `repeat_window_s`;
4. duplicates merge: the same words after folding, or the same question in other words
   (word sets of `merge_min_words` or more sharing `merge_overlap` of their words, Jaccard),
   join the pending question: its viewers grow, it is asked once;
5. a new question needs room (`max_pending`) and the viewer's rate: a token bucket of
   `viewer_burst` questions refilled one per `viewer_interval_s`, so a viewer asking at a
   normal pace is never refused and a flooding one is. Only what is queued or merged takes
   a token: a refused message costs the viewer nothing.

The operator pins (answered first, in pin order) or skips a pending question; otherwise the
oldest goes first, and an unpinned question that waited past `max_wait_s` leaves (its asker
has likely gone). A platform's moderators act through `withdraw_viewer` (a ban or a deleted
message takes the viewer's name off their questions). All methods run on one asyncio loop
(from another thread: `loop.call_soon_threadsafe(queue.offer, message)`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable

from broadcast.chat import text as chat_text
from broadcast.chat.messages import ChatMessage, Question
from gateway.limits import TokenBucket

log = logging.getLogger(__name__)

# Verdict codes: what each means (the HTTP input's status beside it, see web.py)
REASONS: dict[str, str] = {
    "accepted": "queued as a new question",
    "merged": "the same question was pending: the viewer was added to it",
    "empty": "no words left once formatting, control characters and punctuation are removed",
    "no_viewer": "the message names no viewer",
    "too_long": "the question is longer than the limit",
    "blocked": "the viewer or a word of the question is on the blocklist",
    "repeated": "the anchor has just answered this question, or the operator skipped it",
    "rate_limited": "the viewer asked too often: wait before asking again",
    "queue_full": "too many questions are waiting: ask again later",
}


@dataclasses.dataclass(frozen=True)
class ModerationRules:
    viewer_interval_s: float = 30.0  # a viewer's sustained pace: one question per interval
    viewer_burst: int = 2  # ...after a burst of this many (a question and its correction)
    max_chars: int = 200  # after cleaning; Twitch allows 500, a caption holds about 200
    max_viewer_chars: int = 40  # a display name longer than this is cut
    blocked_words: tuple[str, ...] = ()  # words or phrases, whole words, case/accent-blind
    blocked_viewers: tuple[str, ...] = ()  # account names (viewer_id, else display name)
    max_pending: int = 50
    # Jaccard of word sets: "how old are you" ~ "how old are you really" (0.8)
    merge_overlap: float = 0.75
    merge_min_words: int = 3  # shorter texts merge only when their folded words are equal
    repeat_window_s: float = 600.0
    max_wait_s: float = 900.0  # an unpinned question older than this leaves: its asker has gone
    max_tracked_viewers: int = 10_000  # rate buckets kept; idle full ones are dropped past it


@dataclasses.dataclass(frozen=True)
class Verdict:
    accepted: bool  # queued or merged
    merged: bool
    reason: str  # a code of REASONS
    question_id: int | None  # the question it is (or was merged into, or repeats)
    message: str  # what was wrong and what is expected, for people

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Entry:
    question: Question
    folded: str
    words: frozenset[str]
    askers: dict[str, str]  # viewer key -> the name said, in asking order
    queued_at: float  # the queue's clock

    def set_askers(self, askers: dict[str, str]) -> None:
        self.askers = askers
        self.question.viewers = tuple(askers.values())


class ChatQueue:
    """Pending questions, moderated on the way in (see the module's docstring)."""

    def __init__(
        self, rules: ModerationRules | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rules = rules or ModerationRules()
        self._clock = clock
        self._ids = itertools.count(1)
        self._pending: dict[int, _Entry] = {}  # arrival order
        self._pins: list[int] = []  # pin order
        self._recent: collections.deque[tuple[float, _Entry, str]] = collections.deque(maxlen=1000)
        self._buckets: dict[str, TokenBucket] = {}
        self._arrived = asyncio.Event()
        self._blocked_words = tuple(filter(None, map(chat_text.fold, self.rules.blocked_words)))
        self._blocked_viewers = frozenset(v.casefold() for v in self.rules.blocked_viewers)
        self.counts: collections.Counter[str] = collections.Counter()  # verdict codes
        # how questions left: answered, skipped, expired, withdrawn
        self.removed: collections.Counter[str] = collections.Counter()

    def offer(self, message: ChatMessage) -> Verdict:
        """Judge `message`: queue it, merge it into a pending question, or refuse it."""
        self._expire()
        verdict = self._judge(message)
        self.counts[verdict.reason] += 1
        log.debug("%s from %s: %s", verdict.reason, message.viewer_key, verdict.message)
        return verdict

    def _judge(self, message: ChatMessage) -> Verdict:
        rules = self.rules
        viewer = chat_text.clean(message.viewer)[: rules.max_viewer_chars].strip()
        text = chat_text.clean(message.text)
        if not viewer:
            return _refused("no_viewer", "the message needs a viewer: the name the anchor says")
        if not text:
            return _refused("empty", "the question is empty: send words to ask")
        if len(text) > rules.max_chars:
            return _refused(
                "too_long",
                f"the question has {len(text)} characters; at most {rules.max_chars} are taken",
            )
        key = message.viewer_key
        folded = chat_text.fold(text)
        if not folded:  # "???", an emoji: nothing the anchor could answer
            return _refused("empty", "the question has no words: ask in words")
        if key in self._blocked_viewers or any(
            chat_text.contains_phrase(folded, phrase) for phrase in self._blocked_words
        ):
            return _refused("blocked", "this question is not taken here")
        entry = _Entry(
            Question(0, text, (viewer,), message.source, message.received_at),
            folded,
            frozenset(folded.split()),
            {key: viewer},
            self._clock(),
        )
        repeated = self._repeats(entry)
        if repeated is not None:
            return _refused("repeated", repeated[1], repeated[0])
        same = self._duplicate_of(entry)
        if same is not None:
            return self._merge(same, viewer, key)
        if len(self._pending) >= rules.max_pending:
            return _refused(
                "queue_full", f"{len(self._pending)} questions are waiting: ask again later"
            )
        if not self._bucket(key).take():
            return self._rate_limited(key)
        entry.question.id = next(self._ids)
        self._pending[entry.question.id] = entry
        self._arrived.set()
        return Verdict(True, False, "accepted", entry.question.id, "queued")

    def _merge(self, entry: _Entry, viewer: str, key: str) -> Verdict:
        question = entry.question
        if key not in entry.askers:
            if not self._bucket(key).take():  # merging is asking: the same pace
                return self._rate_limited(key)
            entry.set_askers({**entry.askers, key: viewer})
        return Verdict(
            True, True, "merged", question.id, f"the same question is pending: {question.text}"
        )

    def _rate_limited(self, key: str) -> Verdict:
        bucket = self._buckets[key]
        wait_s = max(0.0, (1.0 - bucket.level) / bucket.rate)
        return _refused(
            "rate_limited",
            f"one question every {self.rules.viewer_interval_s:g} s per viewer: "
            f"ask again in {wait_s:.0f} s",
        )

    def _similar(self, a: _Entry, b: _Entry) -> bool:
        if a.folded == b.folded:
            return True
        least = self.rules.merge_min_words
        if len(a.words) < least or len(b.words) < least:
            return False
        return chat_text.overlap(set(a.words), set(b.words)) >= self.rules.merge_overlap

    def _duplicate_of(self, entry: _Entry) -> _Entry | None:
        exact = next((e for e in self._pending.values() if e.folded == entry.folded), None)
        if exact is not None:
            return exact
        candidates = [e for e in self._pending.values() if self._similar(e, entry)]
        return max(
            candidates,
            key=lambda e: chat_text.overlap(set(e.words), set(entry.words)),
            default=None,
        )

    def _repeats(self, entry: _Entry) -> tuple[int, str] | None:
        horizon = self._clock() - self.rules.repeat_window_s
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()
        for at, done, outcome in reversed(self._recent):
            if self._similar(done, entry):
                ago = self._clock() - at
                return done.question.id, f"the anchor {outcome} this question {ago:.0f} s ago"
        return None

    def _bucket(self, key: str) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.rules.max_tracked_viewers:
                self._forget_idle_viewers()
            rate = 1.0 / self.rules.viewer_interval_s
            bucket = self._buckets[key] = TokenBucket(rate, self.rules.viewer_burst, self._clock)
        return bucket

    def _forget_idle_viewers(self) -> None:
        """Drop the buckets that have refilled: a new one starts full, the same."""
        for key, bucket in list(self._buckets.items()):
            bucket.take(0.0)  # brings its level up to now
            if bucket.level >= bucket.cap:
                del self._buckets[key]

    async def next_question(self) -> Question:
        """The next question to answer, once there is one: pinned first (in pin order), then
        the oldest. It leaves the queue; asking it again soon is refused as `repeated`."""
        while not self._expire():
            self._arrived.clear()
            await self._arrived.wait()
        entry = self._pending[self._order()[0]]
        self._remove(entry, "answered")
        return entry.question

    def skip(self, question_id: int) -> bool:
        """Drop a pending question (not asked again within the repeat window); False when it
        is not pending."""
        entry = self._pending.get(question_id)
        if entry is None:
            return False
        self._remove(entry, "skipped")
        return True

    def pin(self, question_id: int) -> bool:
        """Answer this pending question before the unpinned ones; False when not pending."""
        entry = self._pending.get(question_id)
        if entry is None:
            return False
        if not entry.question.pinned:
            entry.question.pinned = True
            self._pins.append(question_id)
        return True

    def unpin(self, question_id: int) -> bool:
        entry = self._pending.get(question_id)
        if entry is None:
            return False
        if entry.question.pinned:
            entry.question.pinned = False
            self._pins.remove(question_id)
        return True

    def withdraw_viewer(self, viewer_key: str) -> int:
        """A platform's moderator removed this viewer (ban, timeout, kick, deleted message):
        their name leaves every pending question, and a question only they asked leaves the
        queue. The number of questions it touched."""
        key, touched = viewer_key.casefold(), 0
        for entry in list(self._pending.values()):
            if key not in entry.askers:
                continue
            touched += 1
            askers = {k: name for k, name in entry.askers.items() if k != key}
            if askers:
                entry.set_askers(askers)
            else:
                self._remove(entry, "withdrawn", remember=False)
        return touched

    def pending(self) -> list[Question]:
        """The pending questions in the order they will be answered (copies)."""
        self._expire()
        return [dataclasses.replace(self._pending[i].question) for i in self._order()]

    def _order(self) -> list[int]:
        return self._pins + [i for i, e in self._pending.items() if not e.question.pinned]

    def _expire(self) -> int:
        """Drop the unpinned questions past max_wait_s; how many are pending."""
        horizon = self._clock() - self.rules.max_wait_s
        for entry in list(self._pending.values()):
            if entry.queued_at < horizon and not entry.question.pinned:
                self._remove(entry, "expired", remember=False)
        return len(self._pending)

    def _remove(self, entry: _Entry, outcome: str, remember: bool = True) -> None:
        """`remember`: asking it again within repeat_window_s is refused as `repeated`."""
        question_id = entry.question.id
        del self._pending[question_id]
        if entry.question.pinned:
            self._pins.remove(question_id)
        self.removed[outcome] += 1
        log.info("question %d %s: %s", question_id, outcome, entry.question.attribution())
        if remember:
            self._recent.append((self._clock(), entry, outcome))


def _refused(reason: str, message: str, question_id: int | None = None) -> Verdict:
    return Verdict(False, False, reason, question_id, message)
