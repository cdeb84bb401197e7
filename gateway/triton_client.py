"""The gateway's one Triton client (asyncio gRPC): `vad`, `asr` and `avatar` calls that take
and return typed values, so that nothing else in the gateway builds a tensor. The
counterpart, across the wire, of avatar/triton/bls.py; the turn's tensors come from
avatar.pipeline.schema."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import numpy as np

from avatar.conversation_tokens import affinity_headers
from avatar.credentials import KEY_HEADER, grpc_key_headers
from avatar.end_of_turn import turn_features
from avatar.model_io import ASR, TURN_DETECTOR, TURN_WORDS, VAD, ModelIO, infer_inputs
from avatar.pipeline import schema
from avatar.pipeline.events import TurnEvent
from avatar.pipeline.priority import PASS_PARAMETER, PRIORITY, AsrPass, current_pass
from avatar.turn_words import features as words_features
from avatar.vad import VadStream

# the page draws the face from the blendshapes: no pixels over the socket
TURN_OUTPUTS = tuple(name for name in schema.OUTPUTS if name != "video")
ASR_OUTPUTS = ("text", "tokens", "detected_language", "end_probability")
log = logging.getLogger(__name__)


# what the `avatar` model says of a session token another secret signed
# (avatar.conversation_tokens.ConversationTokens.verify), and what the client is told instead
SESSION_REJECTED = "not a session this server made"
SESSION_REJECTED_MESSAGE = (
    "the server does not accept this gateway's sessions: the gateway and Triton need the "
    "same session secret (AVATAR_SESSION_SECRET)"
)


class TurnError(Exception):
    """A turn that failed: `code` (gateway.protocol.ERROR_CODES: turn_failed,
    turn_timeout, server_unavailable) and a message safe for the client; the details (the
    model's error, gRPC's, addresses) are logged here, never sent."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _unavailable(error: BaseException) -> bool:
    """Whether a gRPC failure means the server could not be reached."""
    for name in ("status", "code"):  # tritonclient's exception, grpc's AioRpcError
        method = getattr(error, name, None)
        if callable(method):
            return any(s in str(method()) for s in ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
    return isinstance(error, ConnectionError)


@dataclasses.dataclass(frozen=True)
class Transcript:
    text: str
    tokens: list[int]  # Whisper's, for the agreed prefix of the next pass
    language: str  # detected, or the one asked for
    end_probability: float | None = None  # Whisper's end mark after the last word


def _inputs(arrays: Mapping[str, np.ndarray]) -> list:
    import tritonclient.grpc.aio as grpcclient

    return infer_inputs(arrays, grpcclient.InferInput)


def _arrays(result, io: ModelIO) -> dict[str, np.ndarray | None]:
    """A result's outputs of `io`'s model as numpy (None: not in the result)."""
    return {name: result.as_numpy(name) for name in io.outputs}


def _outputs(names: Sequence[str]) -> list:
    import tritonclient.grpc.aio as grpcclient

    return [grpcclient.InferRequestedOutput(name) for name in names]


class TurnCall:
    """One turn's gRPC stream on the `avatar` model; `cancel()` ends it on the server (the
    model sees the cancellation and stops the LLM)."""

    def __init__(self, stream: Any, model: str) -> None:
        self._stream, self.model = stream, model

    def cancel(self) -> None:
        self._stream.cancel()

    async def events(self, idle_timeout_s: float) -> AsyncIterator[TurnEvent]:
        """The turn's events until the stream ends; TurnError on the model's error or when
        nothing came for `idle_timeout_s` (the stream is then cancelled)."""
        responses = self._stream.__aiter__()
        while True:
            try:
                result, error = await asyncio.wait_for(responses.__anext__(), idle_timeout_s)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                self.cancel()
                raise TurnError(
                    "turn_timeout", f"the avatar sent nothing for {idle_timeout_s:g} s"
                ) from None
            except Exception as error:  # the stream itself failed (e.g. Triton unreachable)
                log.warning("%s stream failed: %r", self.model, error)
                if _unavailable(error):
                    raise TurnError("server_unavailable", "the avatar is unavailable") from None
                raise TurnError("turn_failed", "the turn failed on the server") from None
            if error is not None:
                log.warning("%s answered an error: %s", self.model, error)
                if SESSION_REJECTED in str(error):
                    raise TurnError("session_rejected", SESSION_REJECTED_MESSAGE)
                raise TurnError("turn_failed", "the turn failed on the server")
            names = [tensor.name for tensor in result.get_response().outputs]
            event = schema.outputs_event({name: result.as_numpy(name) for name in names})
            if event is not None:
                yield event


@dataclasses.dataclass(frozen=True)
class TritonAccess:
    """How the gateway reaches Triton: its API key (sent as gRPC metadata
    `triton-grpc-protocol-<key_header>`) and, for TLS, the PEM root certificate."""

    api_key: str = ""
    key_header: str = KEY_HEADER
    ca: str | None = None  # PEM file; None: plaintext gRPC

    @property
    def headers(self) -> dict[str, str]:
        return grpc_key_headers(self.api_key, self.key_header)

    def client(self, url: str) -> Any:
        """The asyncio gRPC client of tritonclient for `url`."""
        import tritonclient.grpc.aio as grpcclient

        if self.ca:
            return grpcclient.InferenceServerClient(url, ssl=True, root_certificates=self.ca)
        return grpcclient.InferenceServerClient(url)


class TritonClient:
    """`client`: a tritonclient.grpc.aio.InferenceServerClient (one per gateway);
    `headers`: sent on every call (TritonAccess.headers). The calls of a session also carry
    its id as the affinity header (`session`), so that a load balancer keeps them on the
    replica that holds the conversation."""

    def __init__(
        self,
        client: Any,
        *,
        avatar_model: str = "avatar",
        asr_model: str = "asr",
        headers: Mapping[str, str] | None = None,
    ):
        self.client, self.avatar_model, self.asr_model = client, avatar_model, asr_model
        self.vad_model, self.turn_model, self.words_model = "vad", "turn_detector", "turn_words"
        self.headers = dict(headers or {})

    def _headers(self, session: str) -> dict[str, str]:
        return {**self.headers, **affinity_headers(session)}

    async def model_ready(self, model: str) -> bool:
        return bool(await self.client.is_model_ready(model, headers=self.headers))

    async def not_ready(self) -> list[str]:
        """The models the gateway needs that Triton does not report ready."""
        models = (self.vad_model, self.avatar_model)
        return [m for m in models if not await self.client.is_model_ready(m, headers=self.headers)]

    async def speech_prob(
        self, stream: VadStream, chunk: np.ndarray, *, session: str = ""
    ) -> float:
        """The `vad` model's speech probability of one chunk [512]; `stream` keeps the
        session's recurrent state (the server keeps none)."""
        result = await self.client.infer(
            self.vad_model,
            _inputs(stream.inputs(chunk[None])),
            outputs=_outputs(list(VAD.outputs)),
            headers=self._headers(session),
        )
        outputs = VAD.read_rows({n: result.as_numpy(n) for n in VAD.outputs})
        return float(stream.update(outputs)[0])

    async def turn_complete(self, audio: np.ndarray, *, session: str = "") -> float:
        """The `turn_detector` model's probability that the utterance so far (16 kHz, its
        trailing silence included) is a complete turn."""
        features = await asyncio.to_thread(turn_features, audio)  # ~20 ms of numpy
        result = await self.client.infer(
            self.turn_model,
            _inputs(TURN_DETECTOR.request(input_features=features)),
            outputs=_outputs(list(TURN_DETECTOR.outputs)),
            headers=self._headers(session),
        )
        return float(TURN_DETECTOR.read_response(_arrays(result, TURN_DETECTOR))["probability"])

    async def words_finished(self, text: str, *, session: str = "") -> float | None:
        """The `turn_words` model's probability that `text` (a transcript so far) is a
        finished turn; None when it has no words to judge."""
        row = words_features(text)
        if row is None:
            return None
        result = await self.client.infer(
            self.words_model,
            _inputs(TURN_WORDS.request(features=row)),
            outputs=_outputs(list(TURN_WORDS.outputs)),
            headers=self._headers(session),
        )
        return float(TURN_WORDS.read_response(_arrays(result, TURN_WORDS))["probability"])

    async def transcribe(
        self,
        audio: np.ndarray,
        prefix: Sequence[int] = (),
        language: str | None = None,
        *,
        session: str = "",
        kind: AsrPass | None = None,
    ) -> Transcript:
        """The `asr` model's transcript of `audio` (16 kHz); `prefix`: the tokens earlier
        passes agreed on; `language`: None to detect it; `kind`: what the pass is for (None:
        the calling task's, avatar.pipeline.priority.current_pass), which sets its priority
        level in the model's queue (captions after the passes a reply waits for)."""
        kind = kind or current_pass.get()
        inputs = ASR.request(
            audio=np.asarray(audio, np.float32).reshape(-1),
            prefix=list(prefix) or None,
            language=language or None,
        )
        result = await self.client.infer(
            self.asr_model,
            _inputs(inputs),
            outputs=_outputs(ASR_OUTPUTS),
            headers=self._headers(session),
            priority=PRIORITY[kind],
            parameters={PASS_PARAMETER: kind.value},
        )
        heard = ASR.read_response(_arrays(result, ASR))
        tokens = [int(t) for t in heard["tokens"].reshape(-1)]
        end = heard.get("end_probability")
        end = None if end is None or math.isnan(end) else float(end)
        return Transcript(heard["text"], tokens, heard["detected_language"], end)

    async def sessions_accepted(self, token: str) -> bool:
        """Whether the `avatar` model accepts a session `token` this gateway signed: a turn
        whose controls no model knows, refused after the token is checked (parse_turn),
        so that it costs no model any work."""
        call = self.turn(
            audio=None,
            text="session check",
            session_id=token,
            parent_session_id="",
            controls={"gateway_session_check": 1},
        )
        try:
            async for _event in call.events(idle_timeout_s=30.0):
                pass
        except TurnError as error:
            return error.code != "session_rejected"
        finally:
            call.cancel()
        return True

    def turn(
        self,
        *,
        audio: np.ndarray | None,
        text: str | None,
        session_id: str,
        parent_session_id: str,
        controls: Mapping[str, Any],
        session: str = "",
    ) -> TurnCall:
        """Start one turn on the `avatar` model (decoupled: one gRPC stream); `session`:
        the id its affinity header carries (a fork's parent's)."""
        tensors = schema.encode_request(
            audio=audio,
            text=text,
            session_id=session_id,
            parent_session_id=parent_session_id,
            controls=controls or {},
        )
        request = {
            "model_name": self.avatar_model,
            "inputs": _inputs(tensors),
            "outputs": _outputs(TURN_OUTPUTS),
        }

        async def requests():
            yield request

        stream = self.client.stream_infer(requests(), headers=self._headers(session))
        return TurnCall(stream, self.avatar_model)
