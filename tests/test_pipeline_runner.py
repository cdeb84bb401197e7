"""avatar.pipeline.runner without Triton: admission, one final message per stream, barge-in,
cancellation, a failed turn, and the output tensors against the `avatar` config."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
from test_pipeline import FakeStages

from avatar.pipeline import PipelineConfig, parse_turn
from avatar.pipeline.runner import RunnerConfig, TurnRunner, event_tensors
from avatar.pipeline.turn import Stages
from model_configs.pbtxt import parse_config

AVATAR_CONFIG = Path(__file__).parents[1] / "model_repository" / "avatar" / "config.pbtxt"


class FakeStream:
    """Records what the runner sends; `cancel()` makes is_cancelled() True."""

    def __init__(self, runner: TurnRunner | None = None) -> None:
        self.sent: list[tuple[dict, bool]] = []
        self.failed: list[Exception] = []
        self.closed = threading.Event()
        self.asked_after_close = 0
        self.active_at_close: int | None = None
        self._cancelled = False
        self._runner = runner

    def cancel(self) -> None:
        self._cancelled = True

    def is_cancelled(self) -> bool:
        if self.closed.is_set():
            self.asked_after_close += 1
        return self._cancelled

    def send(self, tensors, final=False) -> None:
        assert not self.closed.is_set(), "a response after the final one"
        self.sent.append((tensors, final))
        if final:
            self.active_at_close = self._runner.active() if self._runner else None
            self.closed.set()

    def fail(self, error: Exception) -> None:
        assert not self.closed.is_set(), "an error after the final response"
        self.failed.append(error)
        self.closed.set()

    def kinds(self) -> list[str]:
        return [t["kind"][0].decode() for t, _ in self.sent]


def _turn(text="Hi", session=""):
    return parse_turn(None, text, session, '{"seed": 1}')


def test_a_turn_streams_transcript_sentences_then_one_final():
    runner = TurnRunner(FakeStages().stages())
    stream = FakeStream(runner)
    assert runner.submit(_turn(), stream)
    assert stream.closed.wait(10)
    assert stream.kinds() == ["transcript", "sentence", "sentence", "final"]
    assert [final for _, final in stream.sent] == [False, False, False, True]
    assert stream.active_at_close == 0  # the slot was free before the client heard the end
    final = stream.sent[-1][0]
    assert json.loads(final["timings"][0])["video"].startswith("none")


def test_admission_refuses_beyond_max_active_turns_and_frees_the_slot():
    gate = threading.Event()
    fake = FakeStages()
    slow = Stages(fake.transcribe, lambda *a: _blocked(gate, fake.chat(*a)), fake.speak)
    changes: list[tuple[int, int]] = []
    runner = TurnRunner(
        slow, RunnerConfig(max_active_turns=1), on_change=lambda t, s: changes.append((t, s))
    )
    first, second = FakeStream(runner), FakeStream(runner)
    assert runner.submit(_turn(), first)
    assert not runner.submit(_turn(), second)  # refused: nothing sent on it
    assert second.sent == [] and second.failed == []
    gate.set()
    assert first.closed.wait(10)
    third = FakeStream(runner)
    assert runner.submit(_turn(), third) and third.closed.wait(10)
    runner.join(5)
    assert changes[-1] == (0, 0) and max(t for t, _ in changes) == 1


def _blocked(gate: threading.Event, sentences):
    gate.wait(10)
    return (yield from sentences)


def test_a_cancelled_stream_ends_with_a_final_response_and_is_not_asked_again():
    fake = FakeStages(reply=[f"Sentence {n}." for n in range(20)], llm_delay=0.05)
    runner = TurnRunner(fake.stages())
    stream = FakeStream(runner)
    runner.submit(_turn(), stream)
    while len(stream.sent) < 2:
        time.sleep(0.01)
    stream.cancel()
    assert stream.closed.wait(10)
    final = stream.sent[-1][0]
    assert json.loads(final["timings"][0])["cancelled"] == "client"
    assert stream.kinds().count("sentence") < 20
    runner.join(5)
    time.sleep(0.3)  # the llm thread drains; it must not ask the closed request
    assert stream.asked_after_close == 0


def test_a_new_turn_of_the_session_supersedes_the_running_one():
    fake = FakeStages(reply=[f"Sentence {n}." for n in range(20)], llm_delay=0.05)
    runner = TurnRunner(fake.stages())
    old, new = FakeStream(runner), FakeStream(runner)
    runner.submit(_turn(session="s1"), old)
    while len(old.sent) < 2:
        time.sleep(0.01)
    runner.submit(_turn("Stop.", session="s1"), new)
    assert old.closed.wait(10) and new.closed.wait(20)
    assert json.loads(old.sent[-1][0]["timings"][0])["cancelled"] == "superseded"
    assert json.loads(new.sent[-1][0]["timings"][0])["cancelled"] == ""


def test_a_failed_turn_closes_its_stream_with_the_error():
    def broken(audio):
        raise RuntimeError("asr is down")

    fake = FakeStages()
    runner = TurnRunner(Stages(broken, fake.chat, fake.speak), RunnerConfig())
    stream = FakeStream(runner)
    runner.submit(parse_turn(np.zeros(16000, np.float32), None, "", "{}"), stream)
    assert stream.closed.wait(10)
    assert stream.sent == [] and "asr is down" in str(stream.failed[0])
    runner.join(5)
    assert runner.active() == 0


def test_event_tensors_match_the_avatar_config():
    config = parse_config(AVATAR_CONFIG)
    declared = {o.name: o for o in config.output}
    runner = TurnRunner(FakeStages().stages(), RunnerConfig(pipeline=PipelineConfig()))
    stream = FakeStream(runner)
    runner.submit(_turn(), stream)
    assert stream.closed.wait(10)
    types = {"TYPE_STRING": object, "TYPE_FP32": np.float32, "TYPE_INT32": np.int32}
    from tritonclient.grpc import model_config_pb2

    for tensors, _ in stream.sent:
        for name, value in tensors.items():
            assert name in declared, f"{name} is not an output of the avatar model"
            dtype = model_config_pb2.DataType.Name(declared[name].data_type)
            assert value.dtype == types[dtype], (name, value.dtype, dtype)
            dims = list(declared[name].dims)
            assert value.ndim == len(dims), (name, value.shape, dims)
    assert event_tensors(_final())["kind"][0] == b"final"


def _final():
    from avatar.pipeline.events import FinalEvent

    return FinalEvent("hi", "hello", "", [], {"stage_ms": {}})


def test_join_says_where_a_turn_that_did_not_end_stands():
    """At unload the `avatar` model logs each turn still running (a turn that outlived its
    client kept the server from stopping in its grace): join returns their stacks."""
    gate = threading.Event()
    fake = FakeStages()
    slow = Stages(fake.transcribe, lambda *a: _blocked(gate, fake.chat(*a)), fake.speak)
    runner = TurnRunner(slow, RunnerConfig())
    stream = FakeStream(runner)
    assert runner.submit(_turn(), stream)
    stacks = runner.join(0.2)
    assert (
        len(stacks) == 1 and "run_turn" in stacks[0] and "_sentences" in stacks[0]
    )  # waits on the llm
    gate.set()
    assert stream.closed.wait(10)
    assert runner.join(5) == []
