"""One live connection (docs/protocol.md), as wiring: microphone chunks -> the `vad` speech
probability (TritonClient) -> the endpointing strategy's events -> what is heard
(Hearing: passes while speaking, the pass at a pause) and the turns (TurnManager: start,
hold, confirm, barge-in). It holds no model; `send_json`/`send_bytes` are the WebSocket's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from avatar.conversation_tokens import ConversationTokens
from avatar.endpointing import (
    AskTurnModel,
    EndpointEvent,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TooShort,
    TurnEndStrategy,
    Utterance,
)
from avatar.errors import RequestError
from avatar.live_protocol import INPUT_RATE, ProtocolError, parse_mic
from avatar.pipeline.request import Controls
from avatar.vad import CHUNK, CHUNK_S, VadStream
from gateway import protocol
from gateway.endpointing import TurnAsks, endpointer
from gateway.hearing import Hearing, PassBudget
from gateway.options import SessionOptions
from gateway.protocol import RefusalError
from gateway.triton_client import TritonClient
from gateway.turns import TurnManager

log = logging.getLogger(__name__)


class Connection:
    """The protocol's server side for one WebSocket connection (its conversation may
    outlive it: a page that reconnects sends `resume`). `budget` is the gateway's (one per
    app); `endpointing` makes the connection's end-of-turn strategy; `tokens` mint and
    verify conversation tokens; `trusted`: a service with the operator key (it may set free persona
    text); `turn_ended(outcome)`: the gateway's metrics."""

    def __init__(
        self,
        triton: TritonClient,
        send_json: Callable[[dict], Awaitable[None]],
        send_bytes: Callable[[bytes], Awaitable[None]],
        options: SessionOptions,
        *,
        budget: PassBudget,
        tokens: ConversationTokens,
        trusted: bool = False,
        endpointing: Callable[[SessionOptions], TurnEndStrategy] = endpointer,
        turn_ended: Callable[[str], None] = lambda _outcome: None,
    ) -> None:
        self.triton, self.send_json = triton, send_json
        self.options, self.tokens, self.trusted = options, tokens, trusted
        self.controls: dict[str, Any] = {}  # as sent to Triton (a preset's text included)
        self.preset = ""  # the operator's persona preset the client chose
        self.turn_gate: Callable[[], None] = lambda: None  # raises RefusalError: typed turns' rate
        self.vad = VadStream()
        self.endpointer = endpointing(options)
        self.pending = np.zeros(0, np.float32)
        self._vad_lock = asyncio.Lock()  # chunks go through the vad in order
        self.turns = TurnManager(
            triton,
            send_json,
            send_bytes,
            self._turn_controls,
            options.silence_timeout_s,
            tokens=tokens,
            ended=turn_ended,
        )

        def transcribe(audio, prefix, language):  # with the session's affinity header
            return triton.transcribe(audio, prefix, language, session=self.turns.affinity)

        self.hearing = Hearing(
            transcribe,
            budget,
            send_json,
            every_s=options.partial_every_s,
            detect_language_s=options.detect_language_s,
            hold=self.turns.hold if options.speculate_turn or options.speculate_held else None,
            hold_every_pause=options.speculate_turn,
            discard=self.turns.discard,
        )
        budget.track(self.turns)
        self.asks = TurnAsks(
            lambda audio: triton.turn_complete(audio, session=self.turns.affinity),
            self.hearing.pause_heard,
            self._answered,
            lambda text: triton.words_finished(text, session=self.turns.affinity),
        )

    @property
    def session_id(self) -> str:
        """The conversation's token (a confirmed speculative turn's fork replaces it)."""
        return self.turns.session_id

    @property
    def persona_text(self) -> bool:
        """Whether this client may send free persona text."""
        return self.trusted or self.options.allow_persona_text

    async def hello(self) -> None:
        ready = protocol.ready(
            self.session_id,
            self.options.end_silence_s,
            sorted(self.options.personas),
            self.persona_text,
        )
        await self.send_json(ready)

    async def resume(self, token: Any) -> None:
        """Go on with the conversation of a token the gateway gave earlier (a page that
        reconnects); a token this secret did not make is refused."""
        try:
            self.tokens.verify(token if isinstance(token, str) else "", "session_token")
        except RequestError:
            raise RefusalError(
                "unauthorized", "session_token is not a session of this server"
            ) from None
        await self.turns.interrupt("superseded")
        self.turns.resume(token.strip())
        await self.send_json(protocol.session(self.session_id))

    async def on_text(self, raw: str) -> None:
        message = protocol.parse_message(raw)
        kind = message["type"]
        if kind == "text":
            text = protocol.typed_text(message)
            self.turn_gate()
            self.hearing.drop()  # a typed turn supersedes what the microphone started...
            if self.endpointer.paused:  # ...but the utterance being spoken goes on
                self.hearing.paused(self.endpointer.audio())
            await self.turns.start(text=text)
        elif kind == "controls":
            await self.set_controls(message.get("controls"))
        elif kind == "interrupt":
            await self.turns.interrupt("client")
        elif kind == "resume":
            await self.resume(message.get("session_token"))
        else:
            await self.send_json(protocol.pong(message.get("t")))

    async def on_binary(self, data: bytes) -> None:
        self.pending = np.concatenate([self.pending, parse_mic(data)])
        async with self._vad_lock:
            while len(self.pending) >= CHUNK:
                chunk, self.pending = self.pending[:CHUNK], self.pending[CHUNK:]
                prob = await self.triton.speech_prob(self.vad, chunk, session=self.turns.affinity)
                for event in self.endpointer.step(chunk, prob):
                    await self._on_endpoint(event)
                if self.endpointer.speaking:
                    self.hearing.speaking(self.endpointer.heard_s, self.endpointer.audio)

    def _turn_controls(self) -> dict[str, Any]:
        """A new turn's controls: the session's, with the language Whisper last heard the
        user speak (the turn checks it against how the words are written)."""
        if self.hearing.language:
            return {**self.controls, "language": self.hearing.language}
        return self.controls

    async def set_controls(self, values: Any) -> None:
        if not isinstance(values, dict):
            raise ProtocolError('"controls" needs an object field "controls"')
        values = dict(values)
        silence = values.pop("end_silence_s", None)  # the gateway's own control
        if silence is not None:
            silence = protocol.end_silence(silence)
        preset = protocol.persona_choice(values, self.options.personas, self.persona_text)
        merged = {**self.controls, **values}
        merged.pop("render", None)  # the page draws the face: no pixels over the socket
        try:
            Controls.from_dict(merged)
        except RequestError as error:
            raise ProtocolError(str(error)) from None
        self.controls = merged
        if preset is not None or "persona" in values:
            self.preset = preset or ""
        if silence is not None:
            self.options = dataclasses.replace(self.options, end_silence_s=silence)
            self.endpointer.set_end_silence(silence)
        controls = {**self.controls, "end_silence_s": self.options.end_silence_s}
        if self.preset:  # the operator's text stays on the server
            controls.pop("persona", None)
            controls["persona_preset"] = self.preset
        await self.send_json(protocol.controls(controls))

    async def close(self) -> None:
        self.hearing.budget.untrack(self.turns)
        self.asks.close()
        self.hearing.close()
        await self.turns.interrupt("closed", notify=False)

    async def _on_endpoint(self, event: EndpointEvent) -> None:
        if isinstance(event, SpeechStarted):
            await self.send_json(protocol.speech_start())
            if self.turns.busy():  # barge-in: the user speaks over the avatar
                await self.turns.interrupt("barge-in")
        elif isinstance(event, SpeechPaused):
            self.hearing.paused(event.audio)
        elif isinstance(event, AskTurnModel):
            self.asks.ask(event)
            if self.asks.answerless:  # a model that failed just now: do not wait for it
                for happened in self.endpointer.decide(None, event.pause):
                    await self._on_endpoint(happened)
        elif isinstance(event, SpeechResumed):
            self.hearing.drop()  # the pause was inside the utterance
        elif isinstance(event, (TooShort, Utterance)):
            limit = self.options.max_utterance_s
            too_long = isinstance(event, Utterance) and len(event.audio) >= (
                (limit - CHUNK_S) * INPUT_RATE
            )  # the endpointer cut it at the maximum
            if isinstance(event, Utterance) and not too_long:
                await self._utterance(event.audio, event.ended_by)
                return
            self.hearing.drop()  # a cough, a click; or noise, a monologue: not a question
            self.hearing.reset()
            await self.send_json(protocol.speech_end(0.0))
            if too_long:
                raise RefusalError(
                    "too_long", f"an utterance longer than {limit:g} s: not answered"
                )

    async def _answered(
        self,
        probability: float | None,
        pause: int,
        text: str | None,
        words: float | None,
        end_mark: float | None,
    ) -> None:
        """The end-of-turn models' answers: in order with the chunks (they may end the turn)."""
        async with self._vad_lock:
            events = self.endpointer.decide(probability, pause, text, words, end_mark)
            if not events and self.options.speculate_held and self.endpointer.holding:
                self.hearing.hold_turn()  # the reply starts while the pause runs on
            for event in events:
                await self._on_endpoint(event)

    async def _utterance(self, audio: np.ndarray, ended_by: str) -> None:
        """The end of speech is confirmed: the held turn, or a turn from the transcript at
        the pause, or (none) from the audio."""
        heard = self.hearing.end()
        seconds = round(len(audio) / INPUT_RATE, 3)
        await self.send_json(protocol.speech_end(seconds, ended_by))
        at_pause = await heard
        if at_pause is not None and at_pause.turn is not None:
            await self.turns.confirm(at_pause.turn)
            return
        await self.turns.start(
            audio=None if at_pause else audio,
            text=at_pause.text if at_pause else None,
            spoken=True,
            asr_prefix_tokens=at_pause.prefix_tokens if at_pause else 0,
        )
