"""The session's end-of-turn strategy (avatar.endpointing.TurnEndStrategy), chosen by the gateway's
options, and the asks of one session to the `turn_detector` model.

`model` (the default): silence endpointing that the end-of-turn models cut short
(avatar.end_of_turn.ModelEndpointer: the audio's probability from `turn_detector` and the
words' from `turn_words` on the transcript at the pause, fused); `silence`: `end_silence_s`
of silence ends every turn. An ask that fails or comes late is no answer: the silence rule
ends the turn, and the gateway keeps serving (a model may be absent from a repository)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np

from avatar.end_of_turn import ModelEndpointer
from avatar.endpointing import AskTurnModel, Endpointer, TurnEndStrategy
from gateway.options import STRATEGIES, SessionOptions

if TYPE_CHECKING:
    from gateway.hearing import AtPause

log = logging.getLogger(__name__)


def endpointer(options: SessionOptions) -> TurnEndStrategy:
    """The strategy `options.endpointing` names."""
    if options.endpointing == "silence":
        return Endpointer(
            threshold=options.threshold,
            end_silence_s=options.end_silence_s,
            max_utterance_s=options.max_utterance_s,
            pause_s=options.speculate_after_s,
        )
    if options.endpointing != "model":
        raise ValueError(f"endpointing {options.endpointing!r}: expected one of {STRATEGIES}")
    return ModelEndpointer(
        threshold=options.threshold,
        end_silence_s=options.end_silence_s,
        max_utterance_s=options.max_utterance_s,
        pause_s=options.speculate_after_s,
        ask_at_s=options.turn_ask_at_s,
        complete_at=options.turn_complete_at,
        incomplete_silence_s=options.turn_incomplete_silence_s,
        fusion=options.turn_fusion,
    )


class TurnAsks:
    """One session's questions to the end-of-turn models: `ask(event)` runs
    `probability(audio)` (turn_detector) in a task, waits for `transcript()` (what the
    speculative pass at the pause heard, which the turn waits for anyway: None without
    one), asks `words(text)` (turn_words) about its text, and hands them and Whisper's end
    mark after the text to `answered(probability, pause, text, words, end_mark)`. A failed
    audio ask answers None (the silence rule decides); a failed words ask leaves the words
    to the endpointer's rule. Each kind of failure is logged once per session."""

    def __init__(
        self,
        probability: Callable[[np.ndarray], Awaitable[float]],
        transcript: Callable[[], Awaitable[AtPause | None]],
        answered: Callable[
            [float | None, int, str | None, float | None, float | None], Awaitable[None]
        ],
        words: Callable[[str], Awaitable[float | None]] | None = None,
    ) -> None:
        self.probability, self.transcript, self.answered = probability, transcript, answered
        self.words = words
        self.tasks: set[asyncio.Task] = set()
        self.failed: set[str] = set()
        # the last audio ask failed: the next one is expected to fail too, so the endpointer
        # is told at once not to wait for it (its answer is still used if one comes)
        self.answerless = False

    def ask(self, event: AskTurnModel) -> None:
        task = asyncio.create_task(self._ask(event))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _failed(self, model: str, error: Exception, then: str) -> None:
        if model not in self.failed:
            log.warning("%s gave no answer (%s): %s", model, then, error)
        self.failed.add(model)

    async def _ask(self, event: AskTurnModel) -> None:
        try:
            probability = await self.probability(event.audio)
        except Exception as error:  # no answer: the silence rule ends the turn
            self._failed("turn_detector", error, "the silence rule decides")
            self.answerless = True
            await self.answered(None, event.pause, None, None, None)  # it waits no more
            return
        self.answerless = False
        heard = await self.transcript()
        text = None if heard is None else heard.text
        end_mark = None if heard is None else heard.end_probability
        words = None
        if text is not None and self.words is not None and "turn_words" not in self.failed:
            try:
                words = await self.words(text)
            except Exception as error:
                self._failed("turn_words", error, "the transcript is read by rule")
        log.debug(
            "end of turn: pause %d, audio %.2f, words %s, end mark %s, text %r",
            event.pause,
            probability,
            "-" if words is None else f"{words:.2f}",
            "-" if end_mark is None else f"{end_mark:.2f}",
            text,
        )
        await self.answered(probability, event.pause, text, words, end_mark)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
