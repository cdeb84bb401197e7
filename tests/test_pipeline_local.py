"""Real turns in this process: `run_turn` over the stages of `avatar.pipeline.local` (the
graphs the embedded server runs, under ONNX Runtime, no Triton): the spoken question's
words in the transcript, reply sentences with audio, ARKit-52 frames on the audio's clock,
rendered frames, a barge-in that stops the generation, and the served turn hearing and
saying what the local one does."""

from __future__ import annotations

import json

import numpy as np
import pytest

from avatar.animation.tables import EMOTIONS
from avatar.pipeline import (
    FinalEvent,
    FramesEvent,
    SentenceEvent,
    TranscriptEvent,
    parse_turn,
    run_turn,
)
from avatar.pipeline.local import local_stages

SHORT = {"max_tokens": 24, "seed": 1}


@pytest.fixture(scope="module")
def stages():
    from serving.served import local_config, local_models

    with local_stages(local_models(render=True), local_config()) as stages:
        yield stages


def run(stages, request, cancelled=lambda events: "") -> tuple[list, FinalEvent]:
    events: list = []
    final = run_turn(request, stages, events.append, lambda: cancelled(events))
    assert events[-1] is final
    return events, final


def sentences(events: list) -> list[SentenceEvent]:
    return [e for e in events if isinstance(e, SentenceEvent)]


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    from avatar.audio import reference_speech

    silence = np.zeros(4000, np.float32)
    return np.concatenate([silence, reference_speech("What is your name?"), silence])


def test_spoken_question_in_process(stages, question):
    request = parse_turn(question, None, "local-spoken", json.dumps(SHORT))
    events, final = run(stages, request)
    assert isinstance(events[0], TranscriptEvent)
    assert "name" in events[0].text.lower(), events[0].text
    assert final.errors == [] and final.cancelled == ""
    spoken = sentences(events)
    assert spoken and final.reply == " ".join(s.text for s in spoken)
    assert not any(isinstance(e, FramesEvent) for e in events)  # render off (the default)
    position = 0.0
    for s in spoken:
        assert s.audio.size and s.sample_rate == 22050 and s.fps == 30.0
        frames = s.blendshapes.shape[0]
        assert s.blendshapes.shape == (frames, 52) and frames > 5
        # whole frames of the turn clock: audio padded to them, no gaps between sentences
        assert frames / s.fps == pytest.approx(s.audio.size / s.sample_rate, abs=1e-3)
        assert s.start == pytest.approx(position, abs=1e-3)
        assert s.animation["visemes"] and s.emotion in EMOTIONS  # "auto": the classifier's
        position += s.audio.size / s.sample_rate
    stage_ms, since = final.timings["stage_ms"], final.timings["since_request_ms"]
    assert all(stage_ms[stage] > 0 for stage in ("asr", "llm", "tts", "animation"))
    assert 0 < since["transcript"] < since["first_audio"] <= since["total"]
    assert 0 < final.timings["llm_stats"]["completion_tokens"] <= SHORT["max_tokens"]


# `extended` (7 s): the served turn renders the chosen face in CI
# (tests/test_portrait_server.py::test_the_face_control_picks_the_renderer[cartoon-256]) and
# takes the emotion control (tests/test_pipeline_server.py::test_text_input_with_controls)
@pytest.mark.extended
def test_text_turn_renders_frames_of_the_chosen_face(stages):
    controls = dict(SHORT, max_tokens=8, render=True, face="cartoon", emotion="happy")
    request = parse_turn(None, "Say hello.", "", json.dumps(controls))
    events, final = run(stages, request)
    assert final.errors == []
    (first, *_) = sentences(events)
    assert first.emotion == "happy"
    # its frames follow it, the audio first
    video = events[events.index(first) + 1]
    assert isinstance(video, FramesEvent) and (video.index, video.start) == (0, first.start)
    assert video.frames.shape == (len(first.blendshapes), 256, 256, 3)  # the cartoon's size
    assert video.frames.dtype == np.uint8 and video.frames.std() > 0


def test_barge_in_stops_the_reply_after_its_first_sentence(stages):
    budget = 200  # tokens: far more than the first sentence and its speech take
    controls = json.dumps({"max_tokens": budget})
    request = parse_turn(None, "Tell me a long story about the sea.", "local-cut", controls)
    events, final = run(stages, request, lambda seen: "barge-in" if sentences(seen) else "")
    assert final.cancelled == "barge-in"
    assert len(sentences(events)) == 1 and final.reply == sentences(events)[0].text
    assert final.errors == []  # the generation was stopped by its turn id (cut)
    assert final.timings["llm_stats"]["completion_tokens"] < budget


@pytest.mark.server
def test_the_served_turn_hears_what_the_local_turn_hears(stages, question, triton_server):
    """The `avatar` model binds the same `run_turn` to BLS calls of the same graphs, with
    the same ASR settings: the spoken question gives the same transcript both ways."""
    from clients.avatar_stream import stream_turn

    served = stream_turn(triton_server.grpc_url, audio=question, controls=SHORT)
    events, _ = run(stages, parse_turn(question, None, "", json.dumps(SHORT)))
    assert served.error == "" and served.transcript == events[0].text
    assert served.sentences and sentences(events)


# ------------------------------------------------------------------ the user's language


def listening(stages):
    """The stages, with what the LLM was asked and each sentence's voice language recorded
    (the real stages still do the work)."""
    import dataclasses

    from avatar.pipeline.prompt import llm_messages

    asked: list = []
    voices: list = []

    def chat(text, request, stop):
        asked.append((request.language, llm_messages(text, request)))
        return (yield from stages.chat(text, request, stop))

    def speak(text, request):
        phonemes = []
        for speech in stages.speak(text, request):
            phonemes += speech.phonemes
            yield speech
        voices.append((text, phonemes))

    return dataclasses.replace(stages, chat=chat, speak=speak), asked, voices


def test_a_spoken_chinese_question_is_answered_and_spoken_in_chinese(stages):
    """espeak-ng's Mandarin question -> Whisper (language detected) -> the LLM told to
    answer in Chinese -> each sentence spoken by the voice of its writing: Han sentences by
    the Mandarin voice (tone letters in its phonemes), any English one by the English."""
    from scipy.signal import resample_poly

    from avatar.languages import answer_instruction, written_in_han
    from avatar.tts.synth import Controls
    from avatar.tts.voices import EspeakSpeaker

    voice = EspeakSpeaker("zh", "cmn")
    controls = Controls.defaults(voice.config)
    # No recorded Chinese speech installs offline; of espeak-ng's formant Mandarin, Whisper
    # base hears this sentence as Chinese ("我想与你个方便"), others as Thai or Latin.
    question = "我想预订一个房间。"
    said = np.concatenate([voice.speak(u, controls).audio for u in voice.units(question)])
    silence = np.zeros(4000, np.float32)
    audio = np.concatenate([silence, resample_poly(said, 320, 441).astype(np.float32), silence])
    observed, asked, voices = listening(stages)
    events, final = run(observed, parse_turn(audio, None, "local-zh", json.dumps(SHORT)))
    transcript = events[0].text
    assert written_in_han(transcript), transcript
    assert final.timings["language"] == "zh"
    ((language, messages),) = asked
    assert language == "zh"
    assert messages[-1]["content"].endswith(answer_instruction("zh")), messages
    assert sentences(events) and voices
    for text, phonemes in voices:
        # the English Piper voice's phonemes carry espeak's stress marks, the Mandarin
        # voice's (from its phoneme events) none, and its first ones are what it says alone
        alone = voice.speak(voice.units(text)[0], controls).phonemes if written_in_han(text) else ()
        assert ("ˈ" in phonemes) != written_in_han(text), (text, phonemes)
        assert phonemes[:3] == list(alone[:3]) or not alone, (phonemes, alone)


def test_typed_turns_take_the_language_of_their_writing(stages):
    observed, asked, _ = listening(stages)
    short = {**SHORT, "max_tokens": 8}
    typed = parse_turn(None, "你叫什么名字？", "local-zh-typed", json.dumps(short))
    _, chinese = run(observed, typed)
    stale = {**short, "language": "zh"}  # the last utterance was Chinese; this text is not
    _, english = run(observed, parse_turn(None, "What is your name?", "", json.dumps(stale)))
    assert (chinese.timings["language"], english.timings["language"]) == ("zh", "en")
    assert [language for language, _ in asked] == ["zh", "en"]
    assert "Answer in" not in asked[1][1][-1]["content"]
