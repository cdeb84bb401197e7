"""The turns of one connection: start, hold (a speculative turn's messages kept until the
end of speech is confirmed), confirm, discard, interrupt (barge-in), and each turn's
typed events forwarded as protocol messages."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from avatar import live_protocol
from avatar.conversation_tokens import ConversationTokens, session_of
from avatar.pipeline.events import FinalEvent, SentenceEvent, TranscriptEvent, TurnEvent
from gateway import protocol
from gateway.triton_client import TritonClient, TurnCall, TurnError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Turn:
    number: int
    session_id: str  # the token of the conversation the turn answers in
    spoken: bool = False  # from the microphone (its transcript may be speculative)
    parent_session_id: str = ""  # the parent's token, for a fork (a speculative turn)
    asr_prefix_tokens: int = 0  # of its transcript, taken from the passes while speaking
    task: asyncio.Task | None = None
    call: TurnCall | None = None
    playing_until: float = 0.0  # monotonic time the client's playback should end
    first_audio_at: float | None = None
    cancelled: str = ""
    held: list[tuple[str, Any]] | None = None  # messages kept until the turn is confirmed
    ending: bool = False  # its stream is over and its turn_end is being sent: let it be

    def stop(self, reason: str) -> None:
        """Mark it cancelled and stop its work, here and on the server."""
        self.cancelled = reason
        if self.call is not None:
            self.call.cancel()  # the avatar model sees the cancellation; the LLM stops
        if self.task is not None and not self.ending:
            self.task.cancel()


class TurnManager:
    """`send_json`/`send_bytes` are the WebSocket's; `controls()` the session's current
    controls for a new turn; a turn silent for `silence_timeout_s` is abandoned. `tokens`
    mint the session tokens (the secret Triton verifies them with); `ended(outcome)` is told
    how each turn ended (the gateway's metrics)."""

    def __init__(
        self,
        triton: TritonClient,
        send_json: Callable[[dict], Awaitable[None]],
        send_bytes: Callable[[bytes], Awaitable[None]],
        controls: Callable[[], dict[str, Any]],
        silence_timeout_s: float,
        *,
        tokens: ConversationTokens,
        ended: Callable[[str], None] = lambda _outcome: None,
    ) -> None:
        self.triton, self.send_json, self.send_bytes = triton, send_json, send_bytes
        self.controls, self.silence_timeout_s = controls, silence_timeout_s
        self.tokens, self.ended = tokens, ended
        self.session_id = ""  # the conversation's token; a confirmed fork replaces it
        self.affinity = ""  # its id for the load balancer: kept across forks
        self.resume(tokens.mint())
        self.numbers = 0  # a discarded speculative turn leaves a gap in the numbers
        self.current: Turn | None = None

    def resume(self, token: str) -> None:
        """Go on with the conversation of `token` (already verified)."""
        self.session_id, self.affinity = token, session_of(token)

    def generating(self) -> bool:
        """A reply is being generated (its turn's stream is open)."""
        turn = self.current
        return bool(turn and not turn.cancelled and turn.task and not turn.task.done())

    def busy(self) -> bool:
        """A reply is being generated or should still be playing on the client."""
        turn = self.current
        if turn is None or turn.cancelled:
            return False
        running = turn.task is not None and not turn.task.done()
        return running or time.monotonic() < turn.playing_until

    async def interrupt(self, reason: str, notify: bool = True) -> None:
        """Stop the current reply: the client stops playback, the server its work."""
        turn = self.current
        if turn is None or turn.cancelled or not (self.busy() or reason == "closed"):
            return
        turn.cancelled = reason  # not busy from here on
        if notify:
            await self.send_json(protocol.interrupt(turn.number, reason))
        turn.stop(reason)
        if turn.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await turn.task  # its turn_end is sent; errors were reported already

    async def start(
        self,
        *,
        audio: np.ndarray | None = None,
        text: str | None = None,
        spoken: bool = False,
        asr_prefix_tokens: int = 0,
    ) -> Turn:
        """A new turn of the conversation; it supersedes the running one."""
        await self.interrupt("superseded")
        turn = self._new(self.session_id, spoken, asr_prefix_tokens)
        self.current = turn
        turn.task = asyncio.create_task(self._run(turn, audio, text))
        return turn

    def hold(self, text: str, asr_prefix_tokens: int) -> Turn:
        """A speculative turn from a transcript at a pause: it answers in a fork of the
        conversation and its messages are kept until `confirm`."""
        turn = self._new(self.tokens.mint(), True, asr_prefix_tokens)
        turn.parent_session_id, turn.held = self.session_id, []
        turn.task = asyncio.create_task(self._run(turn, None, text))
        return turn

    @staticmethod
    def discard(turn: Turn) -> None:
        """A held turn the speaker went on from: it stops and says nothing."""
        turn.stop("discarded")

    async def confirm(self, turn: Turn) -> None:
        """The end of speech is confirmed: the held turn becomes the current one, its
        messages so far are sent, and the conversation goes on in its fork."""
        await self.interrupt("superseded")
        self.current, self.session_id = turn, turn.session_id
        now = time.monotonic()
        if turn.first_audio_at is not None:  # playback starts now, not when it arrived
            turn.playing_until += now - turn.first_audio_at
            turn.first_audio_at = now
        while turn.held:
            kind, item = turn.held.pop(0)
            await (self.send_json(item) if kind == "json" else self.send_bytes(item))
        turn.held = None  # no await since the list was seen empty: nothing is lost
        await self.send_json(protocol.session(turn.session_id))  # the token to resume

    def _new(self, session_id: str, spoken: bool, asr_prefix_tokens: int) -> Turn:
        self.numbers += 1
        return Turn(self.numbers, session_id, spoken, asr_prefix_tokens=asr_prefix_tokens)

    # ------------------------------------------------------------------ one turn's stream

    async def _run(self, turn: Turn, audio: np.ndarray | None, text: str | None) -> None:
        await self._json(
            turn,
            protocol.turn_start(
                turn.number,
                turn.spoken,
                speculative_asr=turn.spoken and text is not None,
                speculative_turn=bool(turn.parent_session_id),
                prefix_tokens=turn.asr_prefix_tokens,
            ),
        )
        controls = {k: v for k, v in self.controls().items() if k != "render"}
        started = time.monotonic()
        try:
            turn.call = self.triton.turn(
                audio=audio,
                text=text,
                session_id=turn.session_id,
                parent_session_id=turn.parent_session_id,
                controls=controls,
                session=self.affinity,  # a fork hashes with its parent
            )
            async for event in turn.call.events(self.silence_timeout_s):
                if await self._forward(turn, event, started):
                    self.ended("completed")
                    return
            if not turn.cancelled:  # the stream ended without the final response
                raise TurnError("turn_failed", "the turn ended before its reply was complete")
        except asyncio.CancelledError:
            self.ended(turn.cancelled or "closed")
            await self._json(turn, protocol.turn_end(turn.number, None, turn.cancelled or "closed"))
            raise
        except Exception as error:  # any broken stream: the client hears why, and the end
            turn.ending = True
            code, message = "internal", "the gateway failed on this turn"
            if isinstance(error, TurnError):
                code, message = error.code, str(error)
            else:
                log.exception("turn %d", turn.number)
            self.ended(code)
            await self._json(turn, protocol.error(code, message, turn.number))
            await self._json(turn, protocol.turn_end(turn.number, None, "error"))
            return
        finally:
            if turn.call is not None:
                turn.call.cancel()
        turn.ending = True
        self.ended(turn.cancelled)
        # the stream ended at its cancellation before the task was told
        await self._json(turn, protocol.turn_end(turn.number, None, turn.cancelled))

    async def _forward(self, turn: Turn, event: TurnEvent, started: float) -> bool:
        """One event -> protocol messages; True after the final one."""
        if turn.cancelled:  # interrupted: nothing of it follows the `interrupt` message
            return False
        if isinstance(event, TranscriptEvent):
            await self._json(
                turn,
                protocol.transcript(turn.number, event.text),
            )
        elif isinstance(event, SentenceEvent):
            await self._sentence(turn, event, started)
        elif isinstance(event, FinalEvent):
            turn.ending = True
            await self._json(turn, protocol.turn_end(turn.number, event, turn.cancelled))
            return True
        return False

    async def _sentence(self, turn: Turn, event: SentenceEvent, started: float) -> None:
        now = time.monotonic()
        if turn.first_audio_at is None and event.audio.size:
            turn.first_audio_at = now
        if turn.first_audio_at is not None:
            end = turn.first_audio_at + event.start + event.duration
            turn.playing_until = max(turn.playing_until, end)
        await self._json(turn, protocol.sentence(turn.number, event, (now - started) * 1000))
        where = (event.index, turn.number, event.start)
        if event.audio.size:
            audio = live_protocol.audio_message(*where, event.sample_rate, event.audio)
            await self._bytes(turn, audio)
        if len(event.blendshapes):
            frames = live_protocol.frames_message(
                *where, event.fps, weights=event.blendshapes, pose=event.head_pose
            )
            await self._bytes(turn, frames)

    async def _json(self, turn: Turn, message: dict) -> None:
        if turn.held is not None:
            turn.held.append(("json", message))
        else:
            await self.send_json(message)

    async def _bytes(self, turn: Turn, data: bytes) -> None:
        if turn.held is not None:
            turn.held.append(("bytes", data))
        else:
            await self.send_bytes(data)
