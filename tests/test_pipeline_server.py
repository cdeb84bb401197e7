"""The `avatar` model (decoupled BLS over asr, llm, tts) on the real embedded tritonserver:
a spoken question end to end, text input, bad requests, cancellation and barge-in."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from grpc_calls import call, execution_counts, strings

from avatar.animation.tables import EMOTIONS
from clients.avatar_stream import stream_turn

pytestmark = pytest.mark.server
SHORT = {"max_tokens": 24, "seed": 1}


@pytest.fixture(scope="module")
def grpc_url(triton_server) -> str:
    return triton_server.grpc_url


@pytest.fixture(scope="module", autouse=True)
def llm_idle_after(grpc_url):
    """Wait for the llm to go idle so later tests find the shared server as it was (a
    cancelled turn stops its generation by a stop request, within a decode step or so)."""
    yield
    deadline, last = time.monotonic() + 120, -1
    while time.monotonic() < deadline:
        count = _stats(grpc_url, "llm_decoder")
        if count == last:
            return
        last = count
        time.sleep(1.0)


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    from avatar.audio import reference_speech

    silence = np.zeros(4000, np.float32)
    return np.concatenate([silence, reference_speech("What is your name?"), silence])


def _stats(url: str, model: str) -> int:
    return execution_counts(url, [model])[model]


def test_spoken_question_streams_transcript_sentences_and_timings(grpc_url, question):
    turn = stream_turn(grpc_url, audio=question, session_id="spoken", controls=SHORT)
    assert turn.error == "", turn.error
    assert "name" in turn.transcript.lower(), turn.transcript
    spoken = [s for s in turn.sentences if s["audio"].size]
    assert spoken, turn.sentences
    position = 0.0
    for s in spoken:
        assert s["sample_rate"] == 22050 and s["fps"] == 30.0
        frames = s["blendshapes"].shape[0]
        assert s["blendshapes"].shape == (frames, 52) and frames > 5
        assert frames / s["fps"] == pytest.approx(s["audio"].size / s["sample_rate"], abs=1e-3)
        assert s["start_time"] == pytest.approx(position, abs=1e-3)  # one clock, no gaps
        assert s["animation"]["visemes"]
        # emotion "auto" (the default): each sentence's own, from the served classifier
        assert s["emotion"] in EMOTIONS, s["emotion"]
        position += s["audio"].size / s["sample_rate"]
    timings = turn.timings
    for stage in ("asr", "llm", "tts", "animation"):
        assert timings["stage_ms"][stage] > 0, stage
    since = timings["since_request_ms"]
    assert 0 < since["transcript"] < since["first_audio"] <= since["total"]
    assert timings["cancelled"] == "" and turn.errors == []
    assert turn.first_audio_s is not None and turn.first_audio_s <= turn.total_s


def test_text_input_with_controls(grpc_url):
    controls = dict(SHORT, fps=25, emotion="happy", intensity=0.5)
    turn = stream_turn(grpc_url, text="Say hello to me.", controls=controls)
    assert turn.error == "" and turn.transcript == "Say hello to me."
    assert turn.sentences and all(s["fps"] == 25.0 for s in turn.sentences)
    assert turn.sentences[0]["emotion"] == "happy"
    assert turn.final["text"].strip()


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ({"audio": np.zeros(1600, np.float32), "text": "hi"}, "exactly one"),
        ({}, "exactly one"),
        ({"audio": np.array([0.1, np.nan, 0.2], np.float32)}, "NaN"),
        ({"text": "   "}, "text is empty"),
        ({"text": "hi", "controls": {"fps": 1000}}, "fps"),
    ],
)
def test_bad_requests_get_clear_errors_and_server_keeps_serving(grpc_url, inputs, words):
    turn = stream_turn(grpc_url, **inputs)
    assert "invalid request" in turn.error and words in turn.error, turn.error
    assert not turn.sentences


@pytest.mark.extended  # CI: the same cancelled turn in test_cancel.py[avatar-cancel]
def test_cancelled_stream_stops_all_work(grpc_url):
    story = {"max_tokens": 160, "seed": 3}
    text = "Tell me a long story about a dragon, in many short sentences."
    turn = stream_turn(
        grpc_url, text=text, controls=story, cancel_when=lambda r: r.get("kind") == "sentence"
    )
    assert len(turn.sentences) == 1 and not turn.final
    time.sleep(1.5)  # the sentence in flight finishes; the llm gets its stop request
    tts, llm = _stats(grpc_url, "tts_vits"), _stats(grpc_url, "llm_decoder")
    time.sleep(2.0)
    assert _stats(grpc_url, "tts_vits") == tts  # no more sentences are synthesised
    assert _stats(grpc_url, "llm_decoder") == llm  # and no more tokens are generated
    after = stream_turn(grpc_url, text="Hello!", controls=SHORT)
    assert after.error == "" and after.final


def test_new_turn_on_same_session_supersedes_the_old_one(grpc_url):
    story = {"max_tokens": 160, "seed": 3}
    first: dict = {}
    started = threading.Event()

    def old_turn() -> None:
        first["turn"] = stream_turn(
            grpc_url,
            text="Tell me a long story about a brave knight.",
            session_id="barge",
            controls=story,
            on_response=lambda r: started.set() if r.get("kind") == "sentence" else None,
        )

    thread = threading.Thread(target=old_turn)
    thread.start()
    assert started.wait(120)
    second = stream_turn(
        grpc_url, text="Stop. What time is it?", session_id="barge", controls=SHORT
    )
    thread.join(120)
    old = first["turn"]
    assert old.error == "" and old.timings["cancelled"] == "superseded"
    assert second.error == "" and second.timings["cancelled"] == ""
    # The session remembers only what the old turn spoke: the new turn's prompt is the
    # persona + the old question + the spoken sentences + the new question.
    spoken = old.final["text"]
    assert spoken and spoken in " ".join(s["text"] for s in old.sentences)
    messages = [
        {"role": "user", "content": "Tell me a long story about a brave knight."},
        {"role": "assistant", "content": spoken},
        {"role": "user", "content": "Stop. What time is it?"},
    ]
    assert second.timings["llm_stats"]["prompt_tokens"] == _prompt_tokens(grpc_url, messages)


def _prompt_tokens(url: str, messages: list[dict]) -> int:
    """The prompt length the llm model counts for these messages (sent whole, no session)."""
    inputs = {"messages": messages, "sampling": {"max_tokens": 1}}
    reply = call(url, "llm", {k: strings(json.dumps(v)) for k, v in inputs.items()})
    assert reply.error is None, reply.error
    return int(json.loads(reply.text("stats", -1))["prompt_tokens"])


def test_render_control_streams_video_frames_with_the_blendshapes(grpc_url):
    turn = stream_turn(grpc_url, text="Hi!", controls={"max_tokens": 8, "seed": 1, "render": True})
    assert turn.error == "", turn.error
    spoken = [s for s in turn.sentences if s["blendshapes"].size]
    assert spoken and turn.errors == []
    # each sentence's pixels follow it in a frames response: the voice never waits for them
    videos = {v["sentence_index"]: v for v in turn.videos}
    assert sorted(videos) == [s["sentence_index"] for s in spoken]
    for s in spoken:
        video = videos[s["sentence_index"]]
        assert video["video"].dtype == np.uint8 and video["video"].shape[3] == 3
        assert len(video["video"]) == len(s["blendshapes"])  # one image per frame
        assert video["start_time"] == s["start_time"] and video["fps"] == s["fps"]
    assert turn.first_audio_s < turn.first_video_s
    since = turn.timings["since_request_ms"]
    assert since["first_audio"] <= since["first_video"]
    assert turn.timings["stage_ms"]["render"] > 0
