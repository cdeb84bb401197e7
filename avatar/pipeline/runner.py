"""Turns as a server runs them (Triton-free): admission, one thread per turn, barge-in
by session, cancellation, and events mapped to output tensors.

The `avatar` model (model_repository/avatar/1/model.py) only adapts Triton to this: it
wraps each request's response sender in a `TurnStream` and binds the `Stages` to BLS
calls. Tests drive the runner with fake streams and stages, without a server.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Protocol

import numpy as np

from avatar.pipeline import schema
from avatar.pipeline.barge_in import SessionTurns
from avatar.pipeline.events import FinalEvent, TurnEvent
from avatar.pipeline.request import TurnRequest
from avatar.pipeline.turn import PipelineConfig, Stages, run_turn

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]


class TurnStream(Protocol):
    """One client stream: the runner sends each event's tensors, then exactly one final
    message (`final=True`, or `fail`)."""

    def is_cancelled(self) -> bool:
        """True once the client cancelled or went away."""

    def send(self, tensors: Tensors, final: bool = False) -> None:
        """Send one response; `final` closes the stream."""

    def fail(self, error: Exception) -> None:
        """Close the stream with an error response."""


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
    max_active_turns: int = 8  # more are refused at once ("server busy")
    settle_timeout_s: float = 2.0  # a superseding turn waits this long for the old one
    pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)


class TurnRunner:
    """Runs each admitted turn on its own thread; `on_change(turns, sessions)` is called
    whenever the counts of running turns or active sessions change (for gauges)."""

    def __init__(
        self,
        stages: Stages,
        config: RunnerConfig = RunnerConfig(),
        *,
        video: Callable[[str], str] = lambda _face: "",
        on_change: Callable[[int, int], None] = lambda turns, sessions: None,
    ) -> None:
        self.stages, self.config = stages, config
        self.video = video  # face control -> the renderer that draws it, "" when not served
        self.on_change = on_change
        self.sessions = SessionTurns()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def submit(self, turn: TurnRequest, stream: TurnStream) -> bool:
        """Start the turn; False (nothing sent) when max_active_turns are running."""
        thread = threading.Thread(
            target=self._run, args=(turn, stream), name="avatar-turn", daemon=True
        )
        with self._lock:
            if len(self._threads) >= self.config.max_active_turns:
                return False
            self._threads.add(thread)
        self._changed()
        thread.start()
        return True

    def active(self) -> int:
        with self._lock:
            return len(self._threads)

    def join(self, timeout_s: float) -> list[str]:
        """Wait (at most timeout_s per turn) for the running turns to end -> where each turn
        still running stands (its thread's stack), so that an unload that waited says why."""
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=timeout_s)
        frames = sys._current_frames()
        return [
            f"{thread.name} ({thread.ident}):\n" + "".join(traceback.format_stack(frame))
            for thread in threads
            if thread.is_alive() and (frame := frames.get(thread.ident or -1)) is not None
        ]

    def _run(self, turn: TurnRequest, stream: TurnStream) -> None:
        token = self.sessions.begin(turn.session_id)
        self._changed()
        ended, lock = threading.Event(), threading.Lock()

        def cancelled() -> str:
            # A drained llm stream may still ask after the final response: never touch the
            # request once its stream is closed.
            with lock:
                if ended.is_set():
                    return "ended"
                if stream.is_cancelled():
                    return "client"
            return "superseded" if token.superseded else ""

        def close(send_final: Callable[[], None]) -> None:
            self._release()  # the slot is free before the client learns the turn ended
            with lock:
                ended.set()
                send_final()

        def emit(event: TurnEvent) -> None:
            try:
                video = self.video(turn.controls.face) if isinstance(event, FinalEvent) else ""
                tensors = event_tensors(event, video)
                if isinstance(event, FinalEvent):
                    close(functools.partial(stream.send, tensors, final=True))
                else:
                    stream.send(tensors)
            except Exception as error:  # e.g. the client went away; the turn still ends
                log.warning("avatar: could not send a response: %s", error)

        try:
            final = run_turn(
                turn,
                self.stages,
                emit,
                cancelled,
                self.config.pipeline,
                settled=lambda: token.wait_previous(self.config.settle_timeout_s),
            )
            if final.cancelled:
                log.info("avatar: turn %d %s", token.number, final.cancelled)
        except Exception as error:  # the turn fails as a whole (e.g. ASR); stream closed
            log.warning("avatar: turn failed: %s: %s", type(error).__name__, error)
            try:
                close(functools.partial(stream.fail, error))
            except Exception as send_error:
                log.warning("avatar: could not send the error: %s", send_error)
        finally:
            self.sessions.end(token)
            self._release()

    def _release(self) -> None:
        """This turn no longer counts against max_active_turns (idempotent)."""
        with self._lock:
            self._threads.discard(threading.current_thread())
        self._changed()

    def _changed(self) -> None:
        # under the lock: two turns ending at once must not write their counts out of order
        with self._lock:
            self.on_change(len(self._threads), self.sessions.active())


# ------------------------------------------------------------------ events -> tensors
def event_tensors(event: TurnEvent, video: str = "") -> Tensors:
    """The `avatar` model's outputs for one event (avatar.pipeline.schema); the final
    timings say whether the turn was cancelled and which renderer drew it ("" when none
    is served)."""
    if isinstance(event, FinalEvent):
        timings = dict(event.timings, cancelled=event.cancelled)
        timings["video"] = video or "none: no renderer model served"
        event = dataclasses.replace(event, timings=timings)
    return schema.event_outputs(event)
