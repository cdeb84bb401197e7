"""What the gateway hears of an utterance before its turn exists: passes over the speech
so far while it is spoken (live captions, and an agreed start for the next pass), and the
pass at its first pause (the transcript the turn starts from if that pause is the end).

`PassBudget` is the gateway's share of ASR: one object per gateway app, passed to every
session (all sessions run on one event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from avatar.asr.agreement import common_prefix
from avatar.live_protocol import INPUT_RATE
from avatar.pipeline.priority import AsrPass, current_pass
from avatar.vad import CHUNK_S
from gateway import protocol
from gateway.triton_client import Transcript

if TYPE_CHECKING:
    from gateway.turns import Turn, TurnManager

log = logging.getLogger(__name__)

Transcribe = Callable[[np.ndarray, list[int], str | None], Awaitable[Transcript]]
SendJson = Callable[[dict], Awaitable[None]]


class PassBudget:
    """ASR passes of all sessions: at most `limit` passes while speaking run at once, so
    that they never take more than that many cores from the turns being answered; with
    `pause_first`, a pass at a pause (which decides when a reply can start) cancels them
    and none starts while it runs; with `max_answering`, none starts while more than that
    many replies are being generated (under load the captions wait: the CPU goes to the
    replies); `track`/`untrack` a session's turns to count its replies."""

    def __init__(
        self, limit: int = 1, pause_first: bool = True, max_answering: int | None = None
    ) -> None:
        self.limit, self.pause_first, self.max_answering = limit, pause_first, max_answering
        self.speaking: set[asyncio.Task] = set()  # passes while speaking, running
        self.pauses = 0  # passes at a pause, running
        self.turns: set[TurnManager] = set()  # of the gateway's sessions

    def track(self, turns: TurnManager) -> None:
        self.turns.add(turns)

    def untrack(self, turns: TurnManager) -> None:
        self.turns.discard(turns)

    def answering(self) -> int:
        """Replies being generated in this gateway now."""
        return sum(turns.generating() for turns in self.turns)

    def has_room(self) -> bool:
        """Whether a pass while speaking may start now."""
        if self.pause_first and self.pauses:
            return False
        if self.max_answering is not None and self.answering() > self.max_answering:
            return False
        return len(self.speaking) < self.limit

    def add(self, task: asyncio.Task) -> None:
        """Count a pass while speaking until it is done."""
        self.speaking.add(task)
        task.add_done_callback(self.speaking.discard)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Around a pass at a pause."""
        self.pauses += 1
        try:
            if self.pause_first:
                running = [task for task in self.speaking if not task.done()]
                for task in running:
                    task.cancel()  # the `asr` model drops the row at its next step
                if running:
                    log.debug("pause: %d pass(es) while speaking cancelled", len(running))
            yield
        finally:
            self.pauses -= 1


@dataclasses.dataclass
class AtPause:
    """What the first pause of an utterance gave: its transcript, and the held turn that
    answers it when speculative turns are on."""

    text: str
    prefix_tokens: int = 0  # the transcript started from what the passes agreed on
    turn: Turn | None = None
    end_probability: float | None = None  # Whisper's end mark after its last word


class Hearing:
    """The ASR side of one session's utterances. `hold(text, prefix_tokens)` starts a held
    turn from a pause's transcript (None: speculative turns off): at every pause with
    `hold_every_pause`, else when `hold_turn()` is called (the end-of-turn models held the
    pause); `discard(turn)` drops it."""

    def __init__(
        self,
        transcribe: Transcribe,
        budget: PassBudget,
        send_json: SendJson,
        *,
        every_s: float | None,
        detect_language_s: float,
        hold: Callable[[str, int], Turn] | None = None,
        hold_every_pause: bool = False,
        discard: Callable[[Turn], None] = lambda turn: None,
    ) -> None:
        self.transcribe, self.budget, self.send_json = transcribe, budget, send_json
        self.every = None if every_s is None else max(1, round(every_s / CHUNK_S))
        self.detect_language_s = detect_language_s
        self.hold, self.hold_every_pause, self.discard = hold, hold_every_pause, discard
        self.language: str | None = None  # Whisper's, of the session's last utterance
        self.at_pause: asyncio.Task | None = None  # -> AtPause
        self.reset()

    def reset(self) -> None:
        """A new utterance: nothing heard, nothing agreed."""
        self.task: asyncio.Task | None = None  # the pass while speaking of this utterance
        self.last_chunks = 0  # audio chunks of the last pass
        self.hypothesis: list[int] | None = None  # the last pass's tokens
        self.prefix: list[int] = []  # what the last two passes began with alike

    # ------------------------------------------------------------------ while speaking

    def speaking(self, heard_s: float, audio: Callable[[], np.ndarray]) -> None:
        """The user is speaking (`heard_s` of the utterance so far): a pass over it, when
        one is due and the gateway has room for it."""
        chunks = round(heard_s / CHUNK_S)
        running = self.task is not None and not self.task.done()
        if self.every is None or running or chunks - self.last_chunks < self.every:
            return
        if not self.budget.has_room():
            return
        if self.language is None and heard_s < self.detect_language_s:
            return  # too little to tell the language by
        task = asyncio.create_task(self._pass(audio(), self.prefix))
        self.task, self.last_chunks = task, chunks
        self.budget.add(task)
        task.add_done_callback(self._learn)

    async def _heard(
        self, audio: np.ndarray, prefix: list[int], language: str | None
    ) -> Transcript:
        started = time.monotonic()
        heard = await self.transcribe(audio, prefix, language)
        log.debug(
            "asr pass: %.2f s of audio, %d prefix tokens: %.0f ms, %d passes in flight: %r",
            len(audio) / INPUT_RATE,
            len(prefix),
            (time.monotonic() - started) * 1000,
            len(self.budget.speaking),
            heard.text,
        )
        return heard

    async def _pass(self, audio: np.ndarray, prefix: list[int]) -> Transcript:
        # this task's passes are captions: Triton serves them after the passes a reply
        # waits for (avatar.pipeline.priority)
        current_pass.set(AsrPass.CAPTION)
        heard = await self._heard(audio, prefix, self.language)
        if asyncio.current_task() is self.task:  # still this utterance's
            await self._caption(heard.text, audio, at_pause=False)
        return heard

    def _learn(self, done: asyncio.Task) -> None:
        # a failed pass (a caption Triton rejected unserved under load) teaches nothing;
        # its exception is read here, whichever utterance's it was, so none goes unretrieved
        if done.cancelled() or done.exception() is not None or done is not self.task:
            return
        tokens = done.result().tokens
        if self.hypothesis is not None:
            self.prefix = common_prefix(self.hypothesis, tokens)
        self.hypothesis = tokens

    async def _caption(self, text: str, audio: np.ndarray, *, at_pause: bool) -> None:
        if text.strip():
            audio_s = round(len(audio) / INPUT_RATE, 3)
            await self.send_json(protocol.partial_transcript(text.strip(), at_pause, audio_s))

    # ------------------------------------------------------------------ at a pause

    def paused(self, audio: np.ndarray) -> None:
        """The first pause: transcribe the utterance so far (and start its held turn),
        while the end of speech is still being confirmed."""
        if self.at_pause is None:
            self.at_pause = asyncio.create_task(self._pause_pass(audio))

    async def _pause_pass(self, audio: np.ndarray) -> AtPause:
        prefix = self.prefix  # read when it runs: a pass that has just ended may have agreed
        current_pass.set(AsrPass.PAUSE)  # a reply may start from it: served first
        with self.budget.pause():
            heard = await self._heard(audio, prefix, None)
        text = heard.text.strip()
        if text:
            self.language = heard.language  # heard over a whole utterance: the passes'
        if asyncio.current_task() is self.at_pause:  # the end of speech is not yet confirmed
            await self._caption(text, audio, at_pause=True)
        result = AtPause(text, len(prefix), end_probability=heard.end_probability)
        if text and self.hold is not None and self.hold_every_pause:
            result.turn = self.hold(text, len(prefix))
        return result

    def hold_turn(self) -> None:
        """The end-of-turn models hold the current pause (its words may go on): start the
        reply from the pause's transcript now, held until the end of speech is confirmed,
        unless one was started already or there is no transcript yet."""
        result = _finished(self.at_pause)
        if self.hold is not None and result is not None and result.text and result.turn is None:
            result.turn = self.hold(result.text, result.prefix_tokens)

    async def pause_heard(self) -> AtPause | None:
        """What the current pause's pass heard, once it is done (None: no pass, or it was
        dropped or failed). Waiting for it does not cancel it."""
        task = self.at_pause
        if task is None:
            return None
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                return None  # the pass was dropped: speech resumed
            raise  # the caller itself was cancelled
        except Exception:  # the failure is logged where the turn takes the pass
            return None

    def drop(self) -> None:
        """The pause was not the end (or a typed turn came): cancel its pass and its turn;
        the conversation is unchanged (that turn answered in a fork of it)."""
        at_pause, self.at_pause = self.at_pause, None
        if at_pause is None:
            return
        if not at_pause.done():
            at_pause.cancel()
            return
        result = _finished(at_pause)
        if result is not None and result.turn:
            self.discard(result.turn)

    def end(self) -> Awaitable[AtPause | None]:
        """The end of speech is confirmed: from now on the pause's pass sends no caption.
        Awaited: what the pause gave, or None (no pause pass, or it failed or heard nothing:
        then the avatar model transcribes the utterance)."""
        at_pause, self.at_pause = self.at_pause, None
        self.reset()
        return self._outcome(at_pause)

    async def _outcome(self, at_pause: asyncio.Task | None) -> AtPause | None:
        if at_pause is None:
            return None
        try:
            result = await at_pause
        except Exception as error:
            log.warning("speculative ASR failed, the avatar transcribes: %s", error)
            return None
        return result if result.text else None

    def close(self) -> None:
        self.drop()
        if self.task is not None:
            self.task.cancel()


def _finished(task: asyncio.Task | None) -> AtPause | None:
    """What a pause's pass gave, if it has finished without failing (a failure is logged
    where the turn takes the pass); None while it runs, or when it was dropped or failed."""
    if task is None or not task.done() or task.cancelled() or task.exception() is not None:
        return None
    return task.result()
