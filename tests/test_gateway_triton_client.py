"""The gateway's Triton client (gateway/triton_client.py) against a fake asyncio gRPC
client that answers with real tritonclient results: the tensors each call sends, and the
typed values and turn events it returns. No server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from test_turn_schema import grpc_result

from avatar.pipeline import schema
from avatar.pipeline.events import FinalEvent, SentenceEvent, TranscriptEvent
from avatar.pipeline.priority import CAPTIONS, FIRST_AUDIO, AsrPass, current_pass
from avatar.pipeline.runner import event_tensors
from avatar.vad import CHUNK, CONTEXT, STATE_SHAPE, VadStream
from gateway.triton_client import TritonClient, TurnError


class FakeStream:
    """`stream_infer`'s answer: (result, error) pairs, then (with `hang`) silence."""

    def __init__(self, responses: list, hang: bool = False) -> None:
        self.responses, self.hang, self.cancelled = responses, hang, False

    def cancel(self) -> None:
        self.cancelled = True

    async def _iterate(self):
        for response in self.responses:
            if isinstance(response, Exception):  # the gRPC stream itself failed
                raise response
            yield response
        if self.hang:
            await asyncio.Event().wait()

    def __aiter__(self):
        return self._iterate()


class FakeGrpc:
    """tritonclient.grpc.aio.InferenceServerClient's calls, recorded and answered."""

    def __init__(self, answers: dict, stream: FakeStream | None = None) -> None:
        self.answers, self.stream = answers, stream
        self.sent: list[tuple[str, dict, list[str]]] = []
        self.headers: list[tuple[str, dict]] = []  # (model or "stream", headers) per call
        self.options: list[tuple[str, dict]] = []

    async def infer(self, model, inputs, outputs=None, headers=None, **options):
        self.headers.append((model, headers))
        self.options.append((model, options))  # priority, parameters
        sent = {i.name(): (i.datatype(), i.shape()) for i in inputs}
        self.sent.append((model, sent, [o.name() for o in outputs]))
        return grpc_result(self.answers[model])

    def stream_infer(self, requests, headers=None):
        self.headers.append(("stream", headers))

        async def first():
            async for request in requests:
                return request

        self.request = asyncio.get_event_loop().create_task(first())
        return self.stream

    async def is_model_ready(self, model: str, headers=None) -> bool:
        return model != "vad"


def test_vad_keeps_the_recurrent_state_of_the_session() -> None:
    answers = {
        "vad": {
            "speech_prob": np.array([[0.75]], np.float32),
            "next_context": np.full((1, CONTEXT), 2.0, np.float32),
            "next_state": np.full((1, *STATE_SHAPE), 3.0, np.float32),
        }
    }
    grpc, stream = FakeGrpc(answers), VadStream()
    prob = asyncio.run(TritonClient(grpc).speech_prob(stream, np.zeros(CHUNK, np.float32)))
    assert prob == 0.75 and stream.state.max() == 3.0 and stream.context.max() == 2.0
    ((model, sent, outputs),) = grpc.sent
    assert model == "vad" and outputs == ["speech_prob", "next_context", "next_state"]
    assert sent == {
        "chunk": ("FP32", [1, CHUNK]),
        "context": ("FP32", [1, CONTEXT]),
        "state": ("FP32", [1, *STATE_SHAPE]),
    }


def test_a_transcript_with_a_prefix_and_a_language() -> None:
    answers = {
        "whisper": {
            "text": np.array([[" Hello."]], object),
            "tokens": np.array([[50, 51, 52]], np.int32),
            "detected_language": np.array([[b"en"]], object),
        }
    }
    grpc = FakeGrpc(answers)
    client = TritonClient(grpc, asr_model="whisper")
    heard = asyncio.run(client.transcribe(np.zeros(800, np.float32), [50, 51], "en"))
    assert (heard.text, heard.tokens, heard.language) == (" Hello.", [50, 51, 52], "en")
    heard = asyncio.run(client.transcribe(np.zeros(800, np.float32)))
    (_, with_prefix, _), (_, plain, _) = grpc.sent
    assert with_prefix == {
        "audio": ("FP32", [1, 800]),
        "prefix": ("INT32", [1, 2]),
        "language": ("BYTES", [1, 1]),
    }
    assert plain == {"audio": ("FP32", [1, 800])}


def test_a_pass_carries_its_priority_level_and_kind() -> None:
    """Captions go after the passes a reply waits for in the `asr` model's queue (its
    priority levels); the kind travels as the request parameter "pass". The calling task's
    kind (avatar.pipeline.priority.current_pass) is the default: gateway/hearing.py sets it
    in each pass's task."""
    answers = {
        "asr": {
            "text": np.array([[" Hi."]], object),
            "tokens": np.array([[50]], np.int32),
            "detected_language": np.array([[b"en"]], object),
        }
    }
    grpc = FakeGrpc(answers)
    client = TritonClient(grpc)

    async def caption():
        current_pass.set(AsrPass.CAPTION)
        return await client.transcribe(np.zeros(800, np.float32))

    async def calls():
        await client.transcribe(np.zeros(800, np.float32))  # unset: a pause's pass
        await asyncio.create_task(caption())
        await client.transcribe(np.zeros(800, np.float32), kind=AsrPass.FINAL)

    asyncio.run(calls())
    assert [options for _, options in grpc.options] == [
        {"priority": FIRST_AUDIO, "parameters": {"pass": "pause"}},
        {"priority": CAPTIONS, "parameters": {"pass": "caption"}},
        {"priority": FIRST_AUDIO, "parameters": {"pass": "final"}},
    ]
    assert FIRST_AUDIO < CAPTIONS  # Triton serves level 1 first


def _sentence() -> SentenceEvent:
    shapes, pose = np.zeros((3, 52), np.float32), np.zeros((3, 3), np.float32)
    return SentenceEvent(
        0, "Hi.", "happy", 0.0, np.ones(2205, np.float32), 22050, 30.0, shapes, pose, {}
    )


def test_a_turn_sends_the_schema_inputs_and_yields_typed_events() -> None:
    events = [TranscriptEvent("hi"), _sentence(), FinalEvent("", "Hi.", "", [], {})]
    responses = [(grpc_result(event_tensors(e)), None) for e in events]
    grpc = FakeGrpc({}, FakeStream(responses))

    async def scenario():
        client = TritonClient(grpc, avatar_model="avatar")
        call = client.turn(
            audio=None, text="Hi", session_id="s1", parent_session_id="", controls={"fps": 30}
        )
        got = [event async for event in call.events(idle_timeout_s=5.0)]
        return got, await grpc.request

    got, request = asyncio.run(scenario())
    assert [type(e) for e in got] == [TranscriptEvent, SentenceEvent, FinalEvent]
    assert got[1].audio.size == 2205 and got[2].reply == "Hi."
    assert request["model_name"] == "avatar"
    sent = {i.name(): (i.datatype(), i.shape()) for i in request["inputs"]}
    assert sent == {
        "text": ("BYTES", [1]),
        "session_id": ("BYTES", [1]),
        "controls": ("BYTES", [1]),
    }
    wanted = [o.name() for o in request["outputs"]]
    assert wanted == [n for n in schema.OUTPUTS if n != "video"]  # the page draws the face


def test_a_failed_unreachable_or_silent_turn_raises_turn_error() -> None:
    async def events(stream: FakeStream, idle_timeout_s: float = 5.0):
        call = TritonClient(FakeGrpc({}, stream)).turn(
            audio=np.zeros(800), text=None, session_id="s", parent_session_id="", controls={}
        )
        return [event async for event in call.events(idle_timeout_s)]

    # the model's error and gRPC's details (addresses) are logged, not put in the message
    with pytest.raises(TurnError, match="failed on the server") as failed:
        asyncio.run(events(FakeStream([(None, RuntimeError("server busy: 8 turns"))])))
    assert failed.value.code == "turn_failed"
    unreachable = ConnectionError("ipv4:10.1.2.3:8001: failed to connect to all addresses")
    with pytest.raises(TurnError, match="unavailable") as down:
        asyncio.run(events(FakeStream([unreachable])))
    assert down.value.code == "server_unavailable" and "10.1.2.3" not in str(down.value)
    silent = FakeStream([(grpc_result(event_tensors(TranscriptEvent("hi"))), None)], hang=True)
    with pytest.raises(TurnError, match=r"sent nothing for 0\.05 s") as timeout:
        asyncio.run(events(silent, idle_timeout_s=0.05))
    assert silent.cancelled and timeout.value.code == "turn_timeout"


def test_every_call_carries_the_api_key_and_the_sessions_affinity_header() -> None:
    from gateway.triton_client import TritonAccess

    access = TritonAccess(api_key="k3y", key_header="avatar-api-key")
    grpc = FakeGrpc(
        {"vad": {"speech_prob": np.array([[0.5]], np.float32),
                 "next_context": np.zeros((1, CONTEXT), np.float32),
                 "next_state": np.zeros((1, *STATE_SHAPE), np.float32)},
         "asr": {"text": np.array([[b"hi"]], object), "tokens": np.array([[1]], np.int32),
                 "detected_language": np.array([[b"en"]], object)}},
        FakeStream([]),
    )  # fmt: skip

    async def scenario():
        client = TritonClient(grpc, headers=access.headers)
        await client.speech_prob(VadStream(), np.zeros(CHUNK, np.float32), session="abc")
        await client.transcribe(np.zeros(800, np.float32), session="abc")
        client.turn(audio=None, text="Hi", session_id="t", parent_session_id="",
                    controls={}, session="abc")  # fmt: skip
        await grpc.request

    asyncio.run(scenario())
    key = {"triton-grpc-protocol-avatar-api-key": "k3y"}
    assert grpc.headers == [(m, {**key, "session-id": "abc"}) for m in ("vad", "asr", "stream")]


def test_readiness_names_the_models_that_are_not_ready() -> None:
    client = TritonClient(FakeGrpc({}), avatar_model="avatar")
    assert asyncio.run(client.not_ready()) == ["vad"]
