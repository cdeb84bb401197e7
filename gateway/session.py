"""One live connection: microphone audio -> `vad` endpointing -> `avatar` turns, barge-in.

Triton is the only inference server: this module holds no model, only the per-connection
state the models need (the vad's recurrent state, the endpointer, the running turn) and
talks to Triton with the asyncio gRPC client. `send_json`/`send_bytes` are the WebSocket's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from avatar.animation.tables import ARKIT_NAMES
from avatar.asr.agreement import common_prefix
from avatar.errors import RequestError
from avatar.pipeline.request import Controls
from avatar.vad import CHUNK, CHUNK_S, Endpointer, VadStream
from avatar.vad import OUTPUTS as VAD_OUTPUTS
from clients.avatar_stream import OUTPUTS, decode_response
from gateway import protocol

log = logging.getLogger(__name__)

AVATAR_OUTPUTS = tuple(n for n in OUTPUTS if n != "video")  # the page draws the face
MAX_TEXT_CHARS = 2000
END_SILENCE_RANGE = (0.2, 2.0)  # seconds of silence that end an utterance (a control)


@dataclasses.dataclass
class SessionOptions:
    end_silence_s: float = 0.7  # silence that ends an utterance (the endpointer's)
    threshold: float = 0.5  # vad speech probability that starts speech
    silence_timeout_s: float = 60.0  # a turn silent this long is abandoned with an error
    model: str = "avatar"
    asr_model: str = "asr"  # the speculative transcripts' model
    # Speculative ASR: transcribe at the first pause of this length, while the endpointer
    # still waits for end_silence_s; the turn then starts from the text at the end of
    # speech. Speech that resumes discards it. None: the avatar model transcribes.
    speculate_after_s: float | None = 0.2
    # Speculative turn: also start the reply from that transcript, in a fork of the
    # conversation (a new session id with the session's memory), and hold its messages
    # until the end of speech is confirmed; then they are sent and the conversation goes on
    # in the fork. Speech that resumes cancels it and leaves the conversation as it was.
    # Off: with the pause's pass first (below) it gains at the median (python -m perf
    # latency --settings today spec_turn, two runs: first audio 0.94-0.98x at 1 session,
    # 0.92x at 2, 0.76-0.81x at 4), but a question with a pause inside starts a reply that
    # is then cancelled, and its work delays the real one: p95 1.17-1.18x at 1 session
    # (docs/performance.md 15). On for many short, unhesitating questions per machine.
    speculate_turn: bool = False
    # Transcribe while the user speaks: every `partial_every_s` of speech, a pass over the
    # speech so far (at most `partial_limit` in flight in this gateway, so that they never
    # take more than that many cores from the turns being answered); what two passes agree
    # on is where the transcript at the pause starts (the `asr` model's `prefix`), so only
    # the last words are decoded token by token. None: off.
    # python -m perf asr-prefix (docs/performance.md section 12): every 1 s keeps the WER
    # on the human recordings and the packaged voice; every 0.5 s raised it.
    partial_every_s: float | None = 1.0
    partial_limit: int = 1
    # The passes take the language of the session's last utterance; before one is known
    # they wait for this much speech: Whisper heard the first second of "What time does the
    # museum open on Sunday?" as Urdu ("وطن دستم مممم...", to its token limit).
    detect_language_s: float = 2.0
    # The pass at a pause decides when the reply can start; the passes while speaking only
    # show captions. So while a pass at a pause runs in this gateway, no pass while speaking
    # starts, and those running (any session's) are cancelled: the `asr` model drops a
    # cancelled request's row at its next decoder step. False: they run alongside.
    pause_first: bool = True


@dataclasses.dataclass
class _Turn:
    number: int
    task: asyncio.Task | None = None
    call: Any = None  # the gRPC stream (cancel() ends the turn on the server)
    playing_until: float = 0.0  # monotonic time the client's playback should end
    first_audio_at: float | None = None
    cancelled: str = ""
    spoken: bool = False  # from the microphone (its transcript may be speculative)
    session_id: str = ""  # the conversation the turn answers in
    parent_session_id: str = ""  # set for a fork (a speculative turn)
    held: list[tuple[str, Any]] | None = None  # messages kept until the turn is confirmed
    asr_prefix_tokens: int = 0  # of its transcript, taken from the passes while speaking


@dataclasses.dataclass
class _Speculation:
    """What the first pause of an utterance started: its transcript, and the turn answering
    it (held) when speculative turns are on."""

    text: str
    prefix_tokens: int = 0  # the transcript started from what the passes agreed on
    turn: _Turn | None = None


class _Partials:
    """The passes over an utterance while it is spoken, and what they agree on."""

    # passes running in this gateway (all sessions: one event loop)
    running: set[asyncio.Task] = set()  # noqa: RUF012 - the gateway's, shared on purpose

    def __init__(self, every_s: float | None):
        self.every = None if every_s is None else max(1, round(every_s / CHUNK_S))
        self.reset()

    def reset(self) -> None:
        """A new utterance: nothing heard, nothing agreed."""
        self.task: asyncio.Task | None = None
        self.last_chunks = 0  # audio chunks of the last pass
        self.hypothesis: list[int] | None = None  # the last pass's tokens
        self.prefix: list[int] = []  # what the last two passes began with alike

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def due(self, chunks: int) -> bool:
        running = self.task is not None and not self.task.done()
        return self.every is not None and not running and chunks - self.last_chunks >= self.every

    def start(self, chunks: int, task: asyncio.Task) -> None:
        self.task, self.last_chunks = task, chunks
        _Partials.running.add(task)
        task.add_done_callback(lambda done: self._finished(done, task))

    @staticmethod
    def cancel_all() -> int:
        """Cancel every pass while speaking in this gateway; how many were running."""
        running = [t for t in _Partials.running if not t.done()]
        for task in running:
            task.cancel()
        return len(running)

    def _finished(self, done: asyncio.Task, task: asyncio.Task) -> None:
        _Partials.running.discard(task)
        if task is not self.task or done.cancelled() or done.exception() is not None:
            return  # an earlier utterance's pass, or a failed one: nothing learnt
        _, tokens = done.result()
        if self.hypothesis is not None:
            self.prefix = common_prefix(self.hypothesis, tokens)
        self.hypothesis = tokens


class LiveSession:
    """The protocol's server side for one WebSocket (docs/protocol.md)."""

    pauses_in_flight = 0  # passes at a pause running in this gateway (all sessions)

    def __init__(
        self,
        client,  # tritonclient.grpc.aio.InferenceServerClient
        send_json: Callable[[dict], Awaitable[None]],
        send_bytes: Callable[[bytes], Awaitable[None]],
        options: SessionOptions | None = None,
    ):
        self.client = client
        self.send_json, self.send_bytes = send_json, send_bytes
        self.options = options or SessionOptions()
        self.session_id = uuid.uuid4().hex
        self.controls: dict[str, Any] = {}
        self.vad = VadStream()
        self.endpointer = Endpointer(
            threshold=self.options.threshold, end_silence_s=self.options.end_silence_s
        )
        self.pending = np.zeros(0, np.float32)
        self.turns = 0
        self.turn: _Turn | None = None
        self.in_speech = False
        self._vad_lock = asyncio.Lock()  # chunks go through the vad in order
        self.speculation: asyncio.Task | None = None  # -> _Speculation of the speech so far
        after = self.options.speculate_after_s
        self._speculate_chunks = None if after is None else max(1, round(after / CHUNK_S))
        self.partials = _Partials(self.options.partial_every_s)
        self.language: str | None = None  # Whisper's, of this session's last utterance

    # ------------------------------------------------------------------ client messages

    async def hello(self) -> None:
        await self.send_json(
            {
                "type": "ready",
                "session_id": self.session_id,
                "input": {"sample_rate": protocol.INPUT_RATE, "format": "pcm_s16le", "kind": 1},
                "frames": {
                    "width": protocol.WIDTH,
                    "names": [*ARKIT_NAMES, "headYaw", "headPitch", "headRoll"],
                },
                "end_silence_s": self.options.end_silence_s,
            }
        )

    async def on_text(self, raw: str) -> None:
        try:
            message = json.loads(raw)
        except json.JSONDecodeError as error:
            raise protocol.ProtocolError(f"text message is not JSON ({error.msg})") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise protocol.ProtocolError('text message must be a JSON object with a "type"')
        kind = message["type"]
        if kind == "text":
            text = message.get("text")
            if not isinstance(text, str) or not text.strip():
                raise protocol.ProtocolError('"text" needs a non-empty string field "text"')
            if len(text) > MAX_TEXT_CHARS:
                raise protocol.ProtocolError(f"text of {len(text)} characters: at most 2000")
            await self.start_turn(text=text.strip())
        elif kind == "controls":
            await self.set_controls(message.get("controls"))
        elif kind == "interrupt":
            await self.interrupt("client")
        elif kind == "ping":
            await self.send_json({"type": "pong", "t": message.get("t")})
        else:
            raise protocol.ProtocolError(
                f"unknown message type {kind!r}: expected text, controls, interrupt or ping"
            )

    async def on_binary(self, data: bytes) -> None:
        samples = protocol.parse_mic(data)
        self.pending = np.concatenate([self.pending, samples])
        async with self._vad_lock:
            while len(self.pending) >= CHUNK:
                chunk, self.pending = self.pending[:CHUNK], self.pending[CHUNK:]
                await self._vad_chunk(chunk)

    async def set_controls(self, values: Any) -> None:
        if not isinstance(values, dict):
            raise protocol.ProtocolError('"controls" needs an object field "controls"')
        values = dict(values)
        silence = values.pop("end_silence_s", None)  # the gateway's own control
        if silence is not None:
            low, high = END_SILENCE_RANGE
            if isinstance(silence, bool) or not isinstance(silence, (int, float)):
                raise protocol.ProtocolError(f"end_silence_s={silence!r}: expected seconds")
            if not low <= silence <= high:
                raise protocol.ProtocolError(
                    f"end_silence_s={silence:g}: expected {low:g} to {high:g} seconds"
                )
        merged = {**self.controls, **values}
        merged.pop("render", None)  # the page draws the face: no pixels over the socket
        try:
            Controls.from_json(json.dumps(merged))
        except RequestError as error:
            raise protocol.ProtocolError(str(error)) from None
        self.controls = merged
        if silence is not None:
            self.options = dataclasses.replace(self.options, end_silence_s=float(silence))
            self.endpointer.set_end_silence(silence)
        await self.send_json(
            {
                "type": "controls",
                "controls": {**self.controls, "end_silence_s": self.options.end_silence_s},
            }
        )

    async def close(self) -> None:
        self._drop_speculation()
        self.partials.cancel()
        await self.interrupt("closed", notify=False)

    # ------------------------------------------------------------------ endpointing

    async def _vad_chunk(self, chunk: np.ndarray) -> None:
        import tritonclient.grpc.aio as grpcclient

        inputs = []
        for name, value in self.vad.inputs(chunk[None]).items():
            tensor = grpcclient.InferInput(name, list(value.shape), "FP32")
            tensor.set_data_from_numpy(np.ascontiguousarray(value, np.float32))
            inputs.append(tensor)
        outputs = [grpcclient.InferRequestedOutput(n) for n in VAD_OUTPUTS]
        result = await self.client.infer("vad", inputs, outputs=outputs)
        prob = float(self.vad.update({n: result.as_numpy(n) for n in VAD_OUTPUTS})[0])
        detector = self.endpointer.detector
        utterance = self.endpointer.push(chunk, prob)
        started = detector.start is not None
        if started and not self.in_speech:
            self.in_speech = True
            await self.send_json({"type": "speech_start"})
            if self.busy():  # barge-in: the user speaks over the avatar
                await self.interrupt("barge-in")
        if started:
            if detector.silent == 0:
                self._partial_pass()
            self._speculate(detector.silent)
        if utterance is not None or (self.in_speech and not started):
            self.in_speech = False
            if utterance is None:  # too short to be a question (a cough, a click)
                self._drop_speculation()
                self.partials.reset()
                await self.send_json({"type": "speech_end", "utterance_s": 0.0})
                return
            speculation, self.speculation = self.speculation, None
            self.partials.reset()
            seconds = round(len(utterance) / protocol.INPUT_RATE, 3)
            await self.send_json({"type": "speech_end", "utterance_s": seconds})
            result = await self._speculated(speculation)
            if result is not None and result.turn is not None:
                await self._confirm(result.turn)
                return
            text = result.text if result is not None else None
            await self.start_turn(
                audio=None if text else utterance,
                text=text,
                spoken=True,
                asr_prefix_tokens=result.prefix_tokens if text else 0,
            )

    def _speculate(self, silent_chunks: int) -> None:
        """Start ASR (and the turn) at the first pause; drop it when the speaker goes on."""
        if self._speculate_chunks is None:
            return
        if silent_chunks == 0 and self.speculation is not None:
            self._drop_speculation()  # the pause was inside the utterance
        elif silent_chunks >= self._speculate_chunks and self.speculation is None:
            audio = np.concatenate(self.endpointer.chunks)
            self.speculation = asyncio.create_task(self._speculative(audio))

    def _partial_pass(self) -> None:
        """While the user speaks: a pass over the speech so far, when one is due and the
        gateway has room for it."""
        chunks = len(self.endpointer.chunks)
        if not self.partials.due(chunks) or len(_Partials.running) >= self.options.partial_limit:
            return
        if self.options.pause_first and LiveSession.pauses_in_flight:
            return  # a pass at a pause comes first (SessionOptions.pause_first)
        if self.language is None and chunks * CHUNK_S < self.options.detect_language_s:
            return  # too little to tell the language by
        audio = np.concatenate(self.endpointer.chunks)
        self.partials.start(chunks, asyncio.create_task(self._heard(audio, self.partials.prefix)))

    async def _heard(self, audio: np.ndarray, prefix: list[int]) -> tuple[str, list[int]]:
        """A pass while the user speaks; the page shows what it heard (live captions)."""
        text, tokens, _ = await self._transcribe(audio, prefix, language=self.language)
        if asyncio.current_task() is self.partials.task:  # still this utterance's
            await self._partial_transcript(text, audio, at_pause=False)
        return text, tokens

    async def _partial_transcript(self, text: str, audio: np.ndarray, *, at_pause: bool) -> None:
        if text.strip():
            await self.send_json(
                {
                    "type": "partial_transcript",
                    "text": text.strip(),
                    "at_pause": at_pause,
                    "audio_s": round(len(audio) / protocol.INPUT_RATE, 3),
                }
            )

    async def _speculative(self, audio: np.ndarray) -> _Speculation:
        prefix = self.partials.prefix
        LiveSession.pauses_in_flight += 1
        try:
            if self.options.pause_first and (cancelled := _Partials.cancel_all()):
                log.debug("pause: %d pass(es) while speaking cancelled", cancelled)
            text, _, language = await self._transcribe(audio, prefix)
        finally:
            LiveSession.pauses_in_flight -= 1
        text = text.strip()
        if text:
            self.language = language  # heard over a whole utterance: the passes' language
        if asyncio.current_task() is self.speculation:  # the end of speech is not yet confirmed
            await self._partial_transcript(text, audio, at_pause=True)
        speculation = _Speculation(text, len(prefix))
        if text and self.options.speculate_turn:
            self.turns += 1  # a discarded speculative turn leaves a gap in the numbers
            turn = _Turn(
                self.turns,
                spoken=True,
                session_id=uuid.uuid4().hex,
                parent_session_id=self.session_id,
                held=[],
                asr_prefix_tokens=len(prefix),
            )
            turn.task = asyncio.create_task(self._run_turn(turn, None, text))
            speculation.turn = turn
        return speculation

    def _drop_speculation(self) -> None:
        """Cancel the speculation and the turn it started; the conversation is unchanged
        (that turn answered in a fork of it)."""
        speculation, self.speculation = self.speculation, None
        if speculation is None:
            return
        if not speculation.done():
            speculation.cancel()
            return
        if speculation.cancelled() or speculation.exception() is not None:
            return
        turn = speculation.result().turn
        if turn is not None:
            turn.cancelled = "discarded"
            if turn.call is not None:
                turn.call.cancel()
            if turn.task is not None:
                turn.task.cancel()

    async def _speculated(self, speculation: asyncio.Task | None) -> _Speculation | None:
        """The speculation's result, or None (none started, or it failed): then the avatar
        model transcribes the utterance itself."""
        if speculation is None:
            return None
        try:
            result = await speculation
        except Exception as error:
            log.warning("speculative ASR failed, the avatar transcribes: %s", error)
            return None
        return result if result.text else None

    async def _confirm(self, turn: _Turn) -> None:
        """The end of speech is confirmed: the held turn becomes the session's turn, its
        messages so far are sent, and the conversation goes on in its fork."""
        await self.interrupt("superseded")
        self.turn = turn
        self.session_id = turn.session_id
        now = time.monotonic()
        if turn.first_audio_at is not None:  # playback starts now, not when it arrived
            turn.playing_until += now - turn.first_audio_at
            turn.first_audio_at = now
        while turn.held:
            kind, item = turn.held.pop(0)
            await (self.send_json(item) if kind == "json" else self.send_bytes(item))
        turn.held = None  # no await since the list was seen empty: nothing is lost

    async def _transcribe(
        self, audio: np.ndarray, prefix: list[int] | None = None, language: str | None = None
    ) -> tuple[str, list[int], str]:
        """(text, tokens, language) of the audio; `prefix`: the tokens earlier passes agreed
        on; `language`: None to detect it."""
        import tritonclient.grpc.aio as grpcclient

        tensor = grpcclient.InferInput("audio", [1, len(audio)], "FP32")
        tensor.set_data_from_numpy(np.ascontiguousarray(audio, np.float32)[None])
        inputs = [tensor]
        if prefix:
            ids = np.array([prefix], np.int32)
            inputs.append(grpcclient.InferInput("prefix", list(ids.shape), "INT32"))
            inputs[-1].set_data_from_numpy(ids)
        if language:
            inputs.append(grpcclient.InferInput("language", [1, 1], "BYTES"))
            inputs[-1].set_data_from_numpy(np.array([[language.encode()]], dtype=object))
        names = ("text", "tokens", "detected_language")
        outputs = [grpcclient.InferRequestedOutput(n) for n in names]
        started = time.monotonic()
        result = await self.client.infer(self.options.asr_model, inputs, outputs=outputs)
        text = result.as_numpy("text").reshape(-1)[0].decode("utf-8", "replace")
        detected = result.as_numpy("detected_language").reshape(-1)[0].decode("utf-8", "replace")
        log.debug(
            "asr pass: %.2f s of audio, %d prefix tokens: %.0f ms, %d passes in flight: %r",
            len(audio) / protocol.INPUT_RATE,
            len(prefix or ()),
            (time.monotonic() - started) * 1000,
            len(_Partials.running),
            text,
        )
        return text, [int(t) for t in result.as_numpy("tokens").reshape(-1)], detected

    def busy(self) -> bool:
        """A reply is being generated or should still be playing on the client."""
        turn = self.turn
        if turn is None or turn.cancelled:
            return False
        running = turn.task is not None and not turn.task.done()
        return running or time.monotonic() < turn.playing_until

    # ------------------------------------------------------------------ turns

    async def interrupt(self, reason: str, notify: bool = True) -> None:
        """Stop the current reply: the client stops playback, the server its work."""
        turn = self.turn
        if turn is None or turn.cancelled or not (self.busy() or reason == "closed"):
            return
        turn.cancelled = reason
        if notify:
            await self.send_json({"type": "interrupt", "turn": turn.number, "reason": reason})
        if turn.call is not None:
            turn.call.cancel()  # the avatar model sees the cancellation; the LLM stops
        if turn.task is not None and not turn.task.done():
            turn.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await turn.task  # its turn_end is sent; errors were reported already

    async def start_turn(
        self,
        *,
        audio: np.ndarray | None = None,
        text: str | None = None,
        spoken: bool = False,
        asr_prefix_tokens: int = 0,
    ) -> None:
        await self.interrupt("superseded")
        if not spoken:  # a typed turn supersedes what the microphone started
            self._drop_speculation()
        self.turns += 1
        turn = _Turn(
            self.turns,
            spoken=spoken,
            session_id=self.session_id,
            asr_prefix_tokens=asr_prefix_tokens,
        )
        self.turn = turn
        turn.task = asyncio.create_task(self._run_turn(turn, audio, text))

    async def _run_turn(self, turn: _Turn, audio: np.ndarray | None, text: str | None) -> None:
        import tritonclient.grpc.aio as grpcclient

        await self._turn_json(
            turn,
            {
                "type": "turn_start",
                "turn": turn.number,
                "input": "audio" if turn.spoken else "text",
                "speculative_asr": turn.spoken and text is not None,
                "speculative_turn": bool(turn.parent_session_id),
                "asr_prefix_tokens": turn.asr_prefix_tokens,
            },
        )
        inputs = []

        def add(name: str, value: np.ndarray, dtype: str) -> None:
            tensor = grpcclient.InferInput(name, list(value.shape), dtype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)

        if audio is not None:
            add("audio", np.ascontiguousarray(audio, np.float32), "FP32")
        if text is not None:
            add("text", np.array([text.encode()], dtype=object), "BYTES")
        add("session_id", np.array([turn.session_id.encode()], dtype=object), "BYTES")
        if turn.parent_session_id:
            add("parent_session_id", np.array([turn.parent_session_id.encode()], object), "BYTES")
        controls = {k: v for k, v in self.controls.items() if k != "render"}
        add("controls", np.array([json.dumps(controls).encode()], dtype=object), "BYTES")
        outputs = [grpcclient.InferRequestedOutput(n) for n in AVATAR_OUTPUTS]

        async def requests():
            yield {"model_name": self.options.model, "inputs": inputs, "outputs": outputs}

        turn.call = self.client.stream_infer(requests())
        started = time.monotonic()
        iterator = turn.call.__aiter__()
        try:
            while True:
                try:
                    result, error = await asyncio.wait_for(
                        iterator.__anext__(), self.options.silence_timeout_s
                    )
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    turn.call.cancel()
                    await self._error(
                        turn,
                        f"the avatar sent nothing for {self.options.silence_timeout_s:g} s; "
                        "turn abandoned",
                    )
                    break
                if error is not None:
                    await self._error(turn, str(error))
                    break
                if await self._forward(turn, result, started):
                    break
        except asyncio.CancelledError:
            await self._turn_json(
                turn,
                {"type": "turn_end", "turn": turn.number, "cancelled": turn.cancelled or "closed"},
            )
            raise
        finally:
            turn.call.cancel()

    async def _error(self, turn: _Turn, message: str) -> None:
        await self._turn_json(turn, {"type": "error", "turn": turn.number, "message": message})
        await self._turn_json(turn, {"type": "turn_end", "turn": turn.number, "cancelled": "error"})

    async def _turn_json(self, turn: _Turn, message: dict) -> None:
        if turn.held is not None:
            turn.held.append(("json", message))
        else:
            await self.send_json(message)

    async def _turn_bytes(self, turn: _Turn, data: bytes) -> None:
        if turn.held is not None:
            turn.held.append(("bytes", data))
        else:
            await self.send_bytes(data)

    async def _forward(self, turn: _Turn, result, started: float) -> bool:
        """One avatar response -> protocol messages; True after the final one."""
        r = decode_response(result)
        kind = r.get("kind")
        if kind == "transcript":
            await self._turn_json(
                turn, {"type": "transcript", "turn": turn.number, "text": r["text"], "final": True}
            )
        elif kind == "sentence":
            index, start = r["sentence_index"], r["start_time"]
            rate, fps = r["sample_rate"], r["fps"]
            audio = r["audio"]
            duration = len(audio) / rate if rate else 0.0
            now = time.monotonic()
            if turn.first_audio_at is None and len(audio):
                turn.first_audio_at = now
            if turn.first_audio_at is not None:
                turn.playing_until = max(turn.playing_until, turn.first_audio_at + start + duration)
            await self._turn_json(
                turn,
                {
                    "type": "sentence",
                    "turn": turn.number,
                    "index": index,
                    "text": r["text"],
                    "emotion": r["emotion"],
                    "start_s": round(start, 4),
                    "duration_s": round(duration, 4),
                    "fps": fps,
                    "animation": json.loads(r["animation"] or "{}"),
                    "error": r["error"],
                    "since_turn_start_ms": round((now - started) * 1000, 1),
                },
            )
            if len(audio):
                await self._turn_bytes(
                    turn, protocol.audio_message(index, turn.number, start, rate, audio)
                )
            if len(r["blendshapes"]):
                await self._turn_bytes(
                    turn,
                    protocol.frames_message(
                        index,
                        turn.number,
                        start,
                        fps,
                        weights=r["blendshapes"],
                        pose=r["head_pose"],
                    ),
                )
        elif kind == "final":
            await self._turn_json(
                turn,
                {
                    "type": "turn_end",
                    "turn": turn.number,
                    "reply": r["text"],
                    "errors": json.loads(r["error"] or "[]"),
                    "timings": json.loads(r["timings"] or "{}"),
                    "cancelled": turn.cancelled,
                },
            )
            return True
        return False
