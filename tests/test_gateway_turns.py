"""The gateway's turn manager (gateway/turns.py) with a fake Triton client: what each turn
sends and when, hold and confirm, discard, barge-in, a failed turn. No server."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from avatar.conversation_tokens import ConversationTokens, session_of
from avatar.live_protocol import Audio, Frames, parse_server_binary
from avatar.pipeline.events import FinalEvent, SentenceEvent, TranscriptEvent
from gateway.triton_client import Transcript, TurnError
from gateway.turns import TurnManager

TOKENS = ConversationTokens("a test secret of enough bytes")


def sentence(index: int = 0, start: float = 0.0, seconds: float = 0.5) -> SentenceEvent:
    rate, fps, frames = 22050, 25.0, round(seconds * 25)
    audio = np.full(round(seconds * rate), 0.1, np.float32)
    shapes, pose = np.full((frames, 52), 0.5, np.float32), np.zeros((frames, 3), np.float32)
    animation = {"visemes": [["aa", 0.0, 0.1]]}
    text = f"Sentence {index}."
    return SentenceEvent(index, text, "happy", start, audio, rate, fps, shapes, pose, animation)


def final(reply: str = "Sentence 0.") -> FinalEvent:
    return FinalEvent("", reply, "", [], {"stage_ms": {"llm": 5.0}, "cancelled": ""})


class FakeCall:
    """A turn's stream: its events, then (with `hang`) nothing until cancelled."""

    def __init__(self, events: list, hang: bool) -> None:
        self.script, self.hang, self.cancelled = events, hang, False

    def cancel(self) -> None:
        self.cancelled = True

    async def events(self, idle_timeout_s: float):
        for item in self.script:
            await asyncio.sleep(0)
            if isinstance(item, Exception):
                raise item
            yield item
        if self.hang:
            await asyncio.Event().wait()


class FakeTriton:
    """TritonClient's methods from scripts: a speech probability per chunk, a transcript
    per pass (held until `asr_go` is set), and the events of each turn."""

    def __init__(self, probs=(), text: str = "Hello there.", turn_events=None, hang=False):
        self.probs = list(probs)
        self.text = text
        self.turn_events = (
            [TranscriptEvent("hi"), sentence(), final()] if turn_events is None else turn_events
        )
        self.hang = hang
        self.asr_go = asyncio.Event()
        self.asr_go.set()
        self.passes: list[dict[str, Any]] = []
        self.turns: list[dict[str, Any]] = []
        self.calls: list[FakeCall] = []
        self.affinity: list[tuple[str, str]] = []  # (model, session-id header) per call

    async def speech_prob(self, stream, chunk: np.ndarray, *, session: str = "") -> float:
        self.affinity.append(("vad", session))
        return self.probs.pop(0) if self.probs else 0.0

    async def transcribe(self, audio, prefix=(), language=None, *, session="") -> Transcript:
        self.affinity.append(("asr", session))
        call = {"seconds": len(audio) / 16000, "prefix": list(prefix), "language": language}
        self.passes.append(call)
        try:
            await self.asr_go.wait()
        except asyncio.CancelledError:
            call["cancelled"] = True
            raise
        return Transcript(self.text, [1, 2, 3, len(self.passes)], "en")

    def turn(self, *, session: str = "", **request) -> FakeCall:
        self.affinity.append(("avatar", session))
        self.turns.append(request)
        self.calls.append(FakeCall(list(self.turn_events), self.hang))
        return self.calls[-1]


class Socket:
    """The WebSocket's two send functions, recording what went out."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send_json(self, message: dict) -> None:
        self.sent.append(message)

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(parse_server_binary(data))

    def types(self) -> list[str]:
        return [m["type"] if isinstance(m, dict) else type(m).__name__ for m in self.sent]


def _manager(triton: FakeTriton, socket: Socket, controls=None) -> TurnManager:
    values = controls if controls is not None else {"fps": 25}
    return TurnManager(
        triton, socket.send_json, socket.send_bytes, lambda: values, 60.0, tokens=TOKENS
    )


def test_a_typed_turn_streams_its_messages_and_plays_on() -> None:
    async def scenario():
        triton, socket = FakeTriton(), Socket()
        turns = _manager(triton, socket, {"fps": 25, "render": True})
        turn = await turns.start(text="Say hi.")
        await turn.task
        return triton, socket, turns.busy()

    triton, socket, busy = asyncio.run(scenario())
    assert socket.types() == ["turn_start", "transcript", "sentence", "Audio", "Frames", "turn_end"]
    start, transcript, message, audio, frames, end = socket.sent
    assert start == {"type": "turn_start", "turn": 1, "input": "text", "speculative_asr": False,
                     "speculative_turn": False, "asr_prefix_tokens": 0}  # fmt: skip
    assert transcript == {"type": "transcript", "turn": 1, "text": "hi", "final": True}
    assert message["animation"] == {"visemes": [["aa", 0.0, 0.1]]} and message["duration_s"] == 0.5
    assert isinstance(audio, Audio) and (audio.turn, audio.sentence, audio.sample_rate) == (
        1,
        0,
        22050,
    )
    assert isinstance(frames, Frames) and frames.fps == 25.0 and len(frames.weights) == 12
    timings = {"stage_ms": {"llm": 5.0}}  # the public fields (protocol.PUBLIC_TIMINGS)
    assert end == {"type": "turn_end", "turn": 1, "reply": "Sentence 0.", "errors": [],
                   "timings": timings, "cancelled": ""}  # fmt: skip
    (request,) = triton.turns
    assert request["text"] == "Say hi." and request["controls"] == {"fps": 25}  # no render
    assert busy, "the reply's 0.5 s of audio is still playing on the client"


def test_barge_in_stops_the_turn_here_and_on_the_server() -> None:
    async def scenario():
        triton, socket = FakeTriton(turn_events=[sentence()], hang=True), Socket()
        turns = _manager(triton, socket)
        turn = await turns.start(audio=np.zeros(16000, np.float32), spoken=True)
        await asyncio.sleep(0.01)
        assert turns.busy()
        await turns.interrupt("barge-in")
        await turns.interrupt("barge-in")  # nothing left to stop: no second message
        return triton, socket, turn, turns.busy()

    triton, socket, turn, busy = asyncio.run(scenario())
    assert socket.types()[-2:] == ["interrupt", "turn_end"]
    assert socket.sent[-2:] == [
        {"type": "interrupt", "turn": 1, "reason": "barge-in"},
        {"type": "turn_end", "turn": 1, "cancelled": "barge-in"},
    ]
    assert triton.calls[0].cancelled and turn.task.done() and not busy
    assert socket.sent[0]["input"] == "audio" and triton.turns[0]["text"] is None


def test_a_held_turn_says_nothing_until_confirmed_then_everything_in_order() -> None:
    async def scenario():
        triton, socket = FakeTriton(), Socket()
        turns = _manager(triton, socket)
        conversation = turns.session_id
        held = turns.hold("What time is it?", asr_prefix_tokens=4)
        await held.task
        before = list(socket.sent)
        await turns.confirm(held)
        return triton, socket, before, conversation, turns

    triton, socket, before, conversation, turns = asyncio.run(scenario())
    assert before == []
    assert socket.types() == [
        "turn_start", "transcript", "sentence", "Audio", "Frames", "turn_end", "session",
    ]  # fmt: skip
    start = socket.sent[0]
    assert (
        start["speculative_turn"] and start["speculative_asr"] and start["asr_prefix_tokens"] == 4
    )
    (request,) = triton.turns
    assert request["parent_session_id"] == conversation != request["session_id"]
    assert turns.session_id == request["session_id"], "the conversation goes on in the fork"


def test_a_discarded_turn_says_nothing_and_leaves_a_gap_in_the_numbers() -> None:
    async def scenario():
        triton, socket = FakeTriton(hang=True, turn_events=[]), Socket()
        turns = _manager(triton, socket)
        conversation = turns.session_id
        held = turns.hold("What time", asr_prefix_tokens=0)
        await asyncio.sleep(0.01)
        turns.discard(held)
        await asyncio.sleep(0.01)
        triton.hang = False
        triton.turn_events = [final()]
        turn = await turns.start(text="What time is it?")
        await turn.task
        return triton, socket, held, conversation, turns

    triton, socket, held, conversation, turns = asyncio.run(scenario())
    assert held.cancelled == "discarded" and triton.calls[0].cancelled
    assert [m.get("turn") for m in socket.sent] == [2, 2]
    assert turns.session_id == conversation == triton.turns[1]["session_id"]


def test_a_failed_turn_says_why_and_ends() -> None:
    async def scenario():
        triton = FakeTriton(turn_events=[TurnError("turn_failed", "the turn failed")])
        socket = Socket()
        turn = await _manager(triton, socket).start(text="x")
        await turn.task
        return socket

    socket = asyncio.run(scenario())
    assert socket.sent[1:] == [
        {"type": "error", "code": "turn_failed", "turn": 1, "message": "the turn failed"},
        {"type": "turn_end", "turn": 1, "cancelled": "error"},
    ]


@pytest.mark.parametrize(
    "broken",
    [
        [sentence(), ConnectionResetError("10.0.0.7:8001 reset")],  # the stream dies
        [sentence(), RuntimeError("Traceback (most recent call last) ...")],  # a bug
        [TranscriptEvent("hi")],  # the stream ends without its final response
    ],
)
def test_a_broken_stream_ends_with_an_error_and_turn_end_and_no_internals(broken) -> None:
    async def scenario():
        triton, socket = FakeTriton(turn_events=broken), Socket()
        turn = await _manager(triton, socket).start(text="x")
        await asyncio.wait_for(turn.task, 2.0)  # bounded
        return socket

    socket = asyncio.run(scenario())
    error, end = socket.sent[-2:]
    assert error["type"] == "error" and error["code"] in ("turn_failed", "internal")
    assert end == {"type": "turn_end", "turn": 1, "cancelled": "error"}
    assert "10.0.0.7" not in str(socket.sent) and "Traceback" not in str(socket.sent)


def test_every_turn_call_carries_the_session_id_and_a_fork_its_parents() -> None:
    async def scenario():
        triton, socket = FakeTriton(), Socket()
        turns = _manager(triton, socket)
        parent = turns.session_id
        await (await turns.start(text="Hi")).task
        held = turns.hold("Tell me more", 0)
        await held.task
        await turns.confirm(held)
        await (await turns.start(text="And then?")).task
        return triton, socket, parent, held

    triton, socket, parent, held = asyncio.run(scenario())
    assert TOKENS.verify(held.session_id) and held.session_id != parent
    assert triton.turns[1]["parent_session_id"] == parent  # the parent's token
    # the affinity header is the parent's id (not its token) on every call, fork included
    assert triton.affinity == [("avatar", session_of(parent))] * 3
    assert {"type": "session", "session_id": session_of(held.session_id),
            "session_token": held.session_id} in socket.sent  # fmt: skip


def test_nothing_of_an_interrupted_turn_follows_its_interrupt_message() -> None:
    """Events still arriving while the stop message is being sent are dropped, the final
    one included: the turn ends with only its reason."""

    class SlowSocket(Socket):
        async def send_json(self, message: dict) -> None:
            for _ in range(10):  # a busy socket: other tasks run meanwhile
                await asyncio.sleep(0)
            await super().send_json(message)

    async def scenario():
        events = [sentence(0), sentence(1, 0.5), sentence(2, 1.0), final()]
        triton, socket = FakeTriton(turn_events=events), SlowSocket()
        turns = _manager(triton, socket)
        turn = await turns.start(text="Tell me more.")
        while not any(isinstance(m, Audio) for m in socket.sent):
            await asyncio.sleep(0)
        await turns.interrupt("barge-in")
        await asyncio.sleep(0.01)
        return socket, turn

    socket, turn = asyncio.run(scenario())
    stop = socket.sent.index({"type": "interrupt", "turn": 1, "reason": "barge-in"})
    assert socket.sent[stop + 1 :] == [{"type": "turn_end", "turn": 1, "cancelled": "barge-in"}]
    assert turn.task.done()
