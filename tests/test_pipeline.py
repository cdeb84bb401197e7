"""avatar.pipeline with fake stages, no Triton: event order, one clock for audio and
frames, LLM/TTS overlap, fallbacks, cancellation and barge-in bookkeeping."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from avatar.errors import RequestError
from avatar.pipeline import (
    FinalEvent,
    PipelineConfig,
    SentenceEvent,
    SessionTurns,
    Speech,
    Stages,
    TranscriptEvent,
    parse_turn,
    run_turn,
)
from avatar.pipeline.request import Controls
from avatar.pipeline.turn import sentence_emotion

RATE = 22050
SYMBOLS = ["^", "h", "ɛ", "l", "o", " ", "m", "a", "$"]


def fake_speech(text: str) -> Speech:
    duration = 0.3 + 0.02 * len(text)
    edges = np.linspace(0.0, duration, len(SYMBOLS) + 1)
    audio = np.sin(np.arange(int(duration * RATE)) / 20.0).astype(np.float32) * 0.1
    return Speech(audio, RATE, list(SYMBOLS), edges[:-1], edges[1:], text)


class FakeStages:
    def __init__(self, reply=("Hello there.", "Nice to meet you."), llm_delay=0.0):
        self.reply, self.llm_delay = list(reply), llm_delay
        self.log: list[tuple[str, str, float]] = []
        self.llm_steps = 0
        self.tts_fail = False

    def transcribe(self, audio: np.ndarray) -> str:
        self.log.append(("asr", "", time.perf_counter()))
        return " what is your name "

    def chat(self, text, request, stop):
        for sentence in self.reply:
            time.sleep(self.llm_delay)
            if stop():
                return {"finish_reason": "cancelled"}
            self.llm_steps += 1
            self.log.append(("llm", sentence, time.perf_counter()))
            yield sentence
        return {"completion_tokens": 7}

    def speak(self, text, request):
        self.log.append(("tts", text, time.perf_counter()))
        if self.tts_fail:
            raise RuntimeError("voice broke")
        yield fake_speech(text)

    def stages(self) -> Stages:
        return Stages(self.transcribe, self.chat, self.speak)


def run(fake: FakeStages, request=None, cancelled=lambda: "", config=None, stages=None):
    events: list = []
    request = request or parse_turn(np.zeros(16000, np.float32), None, "s", "{}")
    stages = stages or fake.stages()
    final = run_turn(request, stages, events.append, cancelled, config or PipelineConfig())
    return events, final


def test_events_in_order_on_one_clock():
    events, final = run(FakeStages())
    assert isinstance(events[0], TranscriptEvent) and events[0].text == "what is your name"
    sentences = [e for e in events if isinstance(e, SentenceEvent)]
    assert [s.text for s in sentences] == ["Hello there.", "Nice to meet you."]
    assert events[-1] is final and isinstance(final, FinalEvent)
    position = 0.0
    for s in sentences:
        assert s.start == pytest.approx(position)
        frames = s.blendshapes.shape[0]
        assert s.blendshapes.shape == (frames, 52) and s.head_pose.shape == (frames, 3)
        assert frames / s.fps == pytest.approx(s.duration, abs=1e-4)  # whole frames of audio
        assert s.animation["visemes"] and s.error == ""
        position += s.duration
    assert final.reply == "Hello there. Nice to meet you."
    assert final.timings["audio_s"] == pytest.approx(position, abs=1e-3)
    assert set(final.timings["stage_ms"]) == {"asr", "llm", "tts", "animation"}
    since = final.timings["since_request_ms"]
    assert since["transcript"] <= since["first_audio"] == since["first_frame"] <= since["total"]
    assert final.timings["llm_stats"] == {"completion_tokens": 7}


def test_tts_of_first_sentence_overlaps_llm_of_the_next():
    fake = FakeStages(reply=("One.", "Two.", "Three."), llm_delay=0.15)
    run(fake)
    first_tts = next(t for kind, text, t in fake.log if kind == "tts" and text == "One.")
    last_llm = next(t for kind, text, t in fake.log if kind == "llm" and text == "Three.")
    assert first_tts < last_llm  # TTS did not wait for the whole reply


def test_tts_failure_gives_text_with_error_flag():
    fake = FakeStages()
    fake.tts_fail = True
    events, final = run(fake)
    sentences = [e for e in events if isinstance(e, SentenceEvent)]
    assert [s.text for s in sentences] == ["Hello there.", "Nice to meet you."]
    assert all(s.error.startswith("tts: voice broke") and s.audio.size == 0 for s in sentences)
    assert any("voice broke" in e for e in final.errors)


def test_reply_pieces_with_nothing_to_say_are_skipped():
    """An LLM piece of emoji only is not spoken, not shown and not an error."""
    fake = FakeStages(reply=("Nice!", " 🍎💡 ", "See you."))
    events, final = run(fake)
    sentences = [e for e in events if isinstance(e, SentenceEvent)]
    assert [s.text for s in sentences] == ["Nice!", "See you."]
    assert [s.index for s in sentences] == [0, 1] and final.errors == []
    assert [text for kind, text, _ in fake.log if kind == "tts"] == ["Nice!", "See you."]


def test_llm_timeout_gives_fallback_reply():
    fake = FakeStages(llm_delay=1.0)
    config = PipelineConfig(llm_timeout_s=0.2, fallback_reply="One moment please.")
    events, final = run(fake, config=config)
    sentences = [e for e in events if isinstance(e, SentenceEvent)]
    assert [s.text for s in sentences] == ["One moment please."]
    assert sentences[0].audio.size > 0
    assert any("no sentence within 0.2 s" in e for e in final.errors)


def test_cancellation_stops_llm_and_tts():
    fake = FakeStages(reply=[f"Sentence {i}." for i in range(20)], llm_delay=0.05)
    flag = threading.Event()
    emitted: list = []

    def emit(event):
        emitted.append(event)
        if isinstance(event, SentenceEvent):
            flag.set()

    request = parse_turn(None, "tell me a story", "s", "")
    final = run_turn(request, fake.stages(), emit, lambda: "client" if flag.is_set() else "")
    time.sleep(0.3)  # the producer thread has had time to notice
    assert final.cancelled == "client"
    assert sum(isinstance(e, SentenceEvent) for e in emitted) == 1
    assert fake.llm_steps < 5 and sum(k == "tts" for k, _, _ in fake.log) <= 2


def test_cancelled_turn_tells_the_llm_what_was_spoken():
    fake = FakeStages(reply=[f"Sentence {i}." for i in range(20)], llm_delay=0.05)
    cuts: list[tuple[str, str]] = []
    stages = dataclasses.replace(
        fake.stages(), cut=lambda r, spoken: cuts.append((r.turn_id, spoken))
    )
    sentences: list[SentenceEvent] = []

    def emit(event):
        if isinstance(event, SentenceEvent):
            sentences.append(event)

    request = parse_turn(None, "tell me a story", "s", "")
    unbounded = PipelineConfig(max_sentences=0)  # barge-in alone (the budget cuts too)
    final = run_turn(
        request, stages, emit, lambda: "client" if len(sentences) >= 2 else "", unbounded
    )
    assert final.cancelled == "client"
    assert cuts == [(request.turn_id, "Sentence 0. Sentence 1.")]  # once, with what was said
    assert final.reply == "Sentence 0. Sentence 1."
    complete = run_turn(
        parse_turn(None, "hi", "s", ""), stages, lambda e: None, lambda: "", unbounded
    )
    assert complete.cancelled == "" and len(cuts) == 1  # a finished turn needs no cut


def test_superseding_turn_waits_for_the_old_one_before_its_llm():
    turns = SessionTurns()
    old = turns.begin("alice")
    new = turns.begin("alice")
    fake = FakeStages()
    order: list[str] = []

    def finish_old() -> None:
        time.sleep(0.2)
        order.append("old ended")
        turns.end(old)

    threading.Thread(target=finish_old).start()
    request = parse_turn(None, "hello", "alice", "")

    def settled() -> None:
        assert new.wait_previous(5.0)
        order.append("settled")

    run_turn(request, fake.stages(), lambda e: None, lambda: "", settled=settled)
    assert order == ["old ended", "settled"]
    assert fake.log[0][0] == "llm"
    assert turns.begin("carol").wait_previous(0.0)  # nothing to wait for


def test_new_turn_supersedes_old_one_of_same_session():
    turns = SessionTurns()
    old = turns.begin("alice")
    other = turns.begin("bob")
    new = turns.begin("alice")
    assert old.superseded and not new.superseded and not other.superseded
    turns.end(old)  # ending a superseded turn leaves the new one active
    assert turns.active() == 2
    turns.end(new)
    turns.end(other)
    assert turns.active() == 0
    anonymous = turns.begin("")
    assert not turns.begin("").superseded and not anonymous.superseded


@pytest.mark.parametrize(
    ("audio", "text", "controls", "words"),
    [
        (np.zeros(10, np.float32), "hi", "", "exactly one"),
        (None, None, "", "exactly one"),
        (np.array([0.0, np.nan], np.float32), None, "", "NaN"),
        (None, "   ", "", "text is empty"),
        (np.zeros(0, np.float32), None, "", "audio is empty"),
        (None, "hi", "{bad", "not valid JSON"),
        (None, "hi", '{"fps": 500}', "fps"),
        (None, "hi", '{"colour": 1}', "unknown controls"),
        (None, "hi", '{"emotion": "bored"}', "unknown emotion"),
        (None, "hi", '{"max_tokens": 0.5e4}', "max_tokens"),
    ],
)
def test_bad_requests_are_rejected_with_reasons(audio, text, controls, words):
    with pytest.raises(RequestError, match=words):
        parse_turn(audio, text, "", controls)


def test_controls_are_parsed():
    request = parse_turn(None, "hi", " s1 ", '{"fps": 25, "alpha": 0.8, "max_tokens": 16}')
    assert request.session_id == "s1" and request.controls.fps == 25
    assert request.controls.max_tokens == 16 and request.controls.alpha == 0.8


def test_auto_emotion_comes_from_each_sentence():
    fake = FakeStages(reply=("Wonderful news!", "Oh no."))
    # a clear change (0.95) passes the hysteresis of tests/test_emotion_hold.py
    moods = {"Wonderful news!": ("happy", 1.0), "Oh no.": ("sad", 0.95)}
    stages = dataclasses.replace(fake.stages(), feel=lambda text: moods[text])
    events, _ = run(fake, stages=stages)
    sentences = [e for e in events if isinstance(e, SentenceEvent)]
    assert [(e.emotion, e.animation["emotion"]["intensity"]) for e in sentences] == [
        ("happy", 0.6),
        ("sad", pytest.approx(0.57)),
    ]
    # Without a classifier, "auto" is neutral; a fixed label is kept as sent.
    assert sentence_emotion("Hi.", Controls(), None).emotion == "neutral"
    fixed = Controls(emotion="angry", intensity=0.4)
    assert sentence_emotion("Hi.", fixed, lambda t: ("happy", 1.0)) == fixed


def test_a_failing_emotion_stage_leaves_the_face_neutral_and_the_turn_whole():
    fake = FakeStages()

    def feel(text):
        raise RuntimeError("emotion_encoder is not ready")

    stages = Stages(fake.transcribe, fake.chat, fake.speak, feel=feel)
    events, final = run(fake, stages=stages)
    sentences = [e for e in events if isinstance(e, SentenceEvent)]
    assert sentences and all(s.audio.size and s.emotion == "neutral" for s in sentences)
    assert any(e.startswith("emotion:") for e in final.errors)


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_deeply_nested_controls_are_a_request_error(depth):
    """Was "internal error: RecursionError" (a review finding)."""
    with pytest.raises(RequestError, match=r"nested too deeply|not valid JSON"):
        parse_turn(None, "hi", "", "[" * depth + "]" * depth)
    with pytest.raises(RequestError, match="controls"):
        parse_turn(None, "hi", "", '{"fps": ' + "[" * depth + "]" * depth + "}")


def test_llm_timeout_stops_the_generation_and_keeps_only_what_was_spoken():
    """Was: the fallback was spoken while the generation ran on to max_tokens and the
    session remembered a reply nobody heard (a review finding)."""
    fake = FakeStages(reply=[f"Sentence {i}." for i in range(5)], llm_delay=0.5)
    cuts: list[str] = []
    stages = Stages(
        fake.transcribe, fake.chat, fake.speak, cut=lambda request, spoken: cuts.append(spoken)
    )
    config = PipelineConfig(llm_timeout_s=0.2, fallback_reply="One moment please.")
    _, final = run(fake, config=config, stages=stages)
    assert cuts == ["One moment please."]
    assert final.reply == "One moment please."
    time.sleep(1.2)  # the generation saw stop() and ended early
    assert fake.llm_steps < 5


def test_each_sentence_goes_out_before_its_pixels_are_drawn():
    """A slow renderer holds neither the first sentence's audio nor its blendshapes: each
    sentence is emitted, then drawn, and its frames follow it on the same clock."""
    fake = FakeStages()
    emitted: list = []
    drawn: list[int] = []

    def render(blendshapes, pose, face):
        drawn.append(len(emitted))  # how many events were out when drawing started
        time.sleep(0.05)
        return np.zeros((len(blendshapes), 4, 4, 3), np.uint8)

    stages = dataclasses.replace(fake.stages(), render=render)
    request = parse_turn(None, "Hi", "s", '{"render": true}')
    final = run_turn(request, stages, emitted.append, lambda: "", PipelineConfig())
    kinds = [type(e).__name__ for e in emitted]
    assert kinds == ["TranscriptEvent", "SentenceEvent", "FramesEvent", "SentenceEvent",
                     "FramesEvent", "FinalEvent"]  # fmt: skip
    for sentence, frames in ((emitted[1], emitted[2]), (emitted[3], emitted[4])):
        assert (frames.index, frames.start, frames.fps) == (sentence.index, sentence.start,
                                                            sentence.fps)  # fmt: skip
        assert len(frames.frames) == len(sentence.blendshapes)
    assert drawn == [2, 4]  # the sentence was out before its drawing started
    since = final.timings["since_request_ms"]
    assert since["first_audio"] <= since["first_video"]
    assert final.timings["stage_ms"]["render"] >= 100


def test_a_failing_renderer_leaves_the_voice_and_the_face():
    def render(blendshapes, pose, face):
        raise RuntimeError("renderer unavailable")

    stages = dataclasses.replace(FakeStages().stages(), render=render)
    events: list = []
    request = parse_turn(None, "Hi", "s", '{"render": true}')
    final = run_turn(request, stages, events.append, lambda: "", PipelineConfig())
    assert [type(e).__name__ for e in events].count("SentenceEvent") == 2
    assert not any(type(e).__name__ == "FramesEvent" for e in events)
    assert final.errors == ["render: renderer unavailable"] * 2


def test_the_emotion_is_classified_while_the_sentence_is_synthesised():
    """The voice waits (up to 5 s) for the classifier to start: a turn that asked for the
    emotion only after the sentence's audio would wait the whole 5 s and fail here."""
    import threading

    fake = FakeStages(reply=("Wonderful news!",))
    started = threading.Event()

    def feel(text):
        started.set()
        return "happy", 1.0

    def speak(text, request):
        assert started.wait(5.0), "the emotion was not asked for beside the voice"
        yield fake_speech(text)

    stages = dataclasses.replace(fake.stages(), speak=speak, feel=feel)
    events, final = run(fake, stages=stages)
    (sentence,) = [e for e in events if isinstance(e, SentenceEvent)]
    assert sentence.emotion == "happy" and not final.errors


def test_the_pieces_of_a_sentence_go_out_as_they_are_synthesised():
    """The second piece of a long sentence is synthesised after the first went out."""
    fake = FakeStages(reply=("One long sentence, then its second half.",))
    emitted: list = []

    def speak(text, request):
        yield fake_speech("One long sentence,")
        emitted.append(len([e for e in events if isinstance(e, SentenceEvent)]))
        yield fake_speech("then its second half.")

    events: list = []
    request = parse_turn(np.zeros(16000, np.float32), None, "s", "{}")
    stages = dataclasses.replace(fake.stages(), speak=speak)
    run_turn(request, stages, events.append, lambda: "", PipelineConfig())
    assert emitted == [1]  # the first piece was out before the second was made
    assert [e.text for e in events if isinstance(e, SentenceEvent)] == [
        "One long sentence,",
        "then its second half.",
    ]


def test_later_sentences_go_to_tts_just_ahead_of_playback():
    """With speak_ahead_s, a later sentence's TTS waits until the audio already sent is at
    most that far ahead of playback (from the first audio), so that a turn does not
    synthesise its whole reply at once while other turns wait for their first audio; a
    barge-in still stops the wait at once."""
    reply = ("Hello there, friend.", "I am fine.", "And you?")  # 0.7, 0.5, 0.46 s of audio
    fake = FakeStages(reply)
    events, final = run(fake, config=PipelineConfig(speak_ahead_s=0.2))
    tts = [at for stage, _, at in fake.log if stage == "tts"]
    sentences = [e for e in events if isinstance(e, SentenceEvent)]
    assert len(sentences) == 3 and not final.errors
    # the 2nd waits until the 1st's audio is 0.2 s from its end; the 3rd for the 2nd's
    assert tts[1] - tts[0] == pytest.approx(sentences[1].start - 0.2, abs=0.08)
    assert tts[2] - tts[0] == pytest.approx(sentences[2].start - 0.2, abs=0.08)
    assert final.timings["paced_ms"] > 900

    fake = FakeStages(reply)  # off (0): each sentence as soon as the LLM wrote it
    run(fake, config=PipelineConfig(speak_ahead_s=0.0))
    tts = [at for stage, _, at in fake.log if stage == "tts"]
    assert tts[2] - tts[0] < 0.1

    fake, stop = FakeStages(reply), threading.Event()
    threading.Timer(0.3, stop.set).start()  # a barge-in while the 2nd sentence waits
    started = time.perf_counter()
    events, final = run(
        fake,
        cancelled=lambda: "client" if stop.is_set() else "",
        config=PipelineConfig(speak_ahead_s=0.05),
    )
    assert time.perf_counter() - started < 0.5
    assert [e.text for e in events if isinstance(e, SentenceEvent)] == [reply[0]]
