"""The session's end-of-turn strategy (avatar.vad.TurnEndStrategy), chosen by the gateway's
options, and the asks of one session to the `turn_detector` model.

`model` (the default): silence endpointing that the end-of-turn model cuts short
(avatar.end_of_turn.ModelEndpointer: the model's probability, and the transcript at the
pause read for a finished sentence); `silence`: `end_silence_s` of silence ends every turn.
An ask that fails or comes late is no answer: the silence rule ends the turn, and the
gateway keeps serving (the model may be absent from a repository)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import numpy as np

from avatar.end_of_turn import ModelEndpointer
from avatar.vad import AskTurnModel, Endpointer, TurnEndStrategy
from gateway.options import SessionOptions

log = logging.getLogger(__name__)
STRATEGIES = ("model", "silence")


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
    )


class TurnAsks:
    """One session's questions to `turn_detector`: `ask(event)` runs `probability(audio)`
    in a task, waits for `transcript()` (the speculative transcript at the pause, which the
    turn waits for anyway: None without one) and hands both to
    `answered(probability, pause, text)`; a failed ask is logged once per session and is no
    answer."""

    def __init__(
        self,
        probability: Callable[[np.ndarray], Awaitable[float]],
        transcript: Callable[[], Awaitable[str | None]],
        answered: Callable[[float, int, str | None], Awaitable[None]],
    ) -> None:
        self.probability, self.transcript, self.answered = probability, transcript, answered
        self.tasks: set[asyncio.Task] = set()
        self.failed = False

    def ask(self, event: AskTurnModel) -> None:
        task = asyncio.create_task(self._ask(event))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _ask(self, event: AskTurnModel) -> None:
        try:
            probability = await self.probability(event.audio)
        except Exception as error:  # no answer: the silence rule ends the turn
            if not self.failed:
                log.warning("turn_detector gave no answer (the silence rule decides): %s", error)
            self.failed = True
            return
        text = await self.transcript()
        log.debug("turn_detector: pause %d, p %.2f, text %r", event.pause, probability, text)
        await self.answered(probability, event.pause, text)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
