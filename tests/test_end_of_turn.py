"""The end-of-turn models (export/turn_detector and export/turn_words, avatar/end_of_turn.py
and avatar/turn_words.py): the audio's features against the reference extractor, the
words' features, the endpointing strategy that asks and fuses them, and the models served
by a real tritonserver and used by the live gateway."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from avatar.end_of_turn import (
    ASK_AT_S,
    FEATURES_SHAPE,
    Fusion,
    ModelEndpointer,
    text_complete,
    turn_features,
)
from avatar.endpointing import AskTurnModel, SpeechPaused, TooShort, Utterance
from avatar.turn_words import FEATURES, features, words
from avatar.vad import CHUNK, CHUNK_S
from evals.recordings import human_clips


def _reference_features(audio: np.ndarray) -> np.ndarray:
    """Smart Turn's own input: transformers' WhisperFeatureExtractor with 8-s chunks over
    the last 8 s, zero-padded in front (pipecat's LocalSmartTurnAnalyzerV3)."""
    from transformers import WhisperFeatureExtractor

    window = audio[-128_000:]
    window = np.pad(window, (128_000 - len(window), 0))
    extractor = WhisperFeatureExtractor(chunk_length=8)
    return extractor(
        window,
        sampling_rate=16_000,
        padding="max_length",
        max_length=128_000,
        truncation=True,
        do_normalize=True,
        return_tensors="np",
    ).input_features[0]


@pytest.mark.parametrize("seconds", [0.6, 3.0, 11.0])  # padded, padded, cut to its last 8 s
def test_features_match_the_reference_extractor(seconds: float) -> None:
    speech = np.concatenate([c.audio for c in human_clips()[:3]])
    audio = speech[: round(seconds * 16_000)].astype(np.float32)
    ours = turn_features(audio)
    assert ours.shape == FEATURES_SHAPE and ours.dtype == np.float32
    np.testing.assert_allclose(ours, _reference_features(audio), atol=1e-4)


def test_a_transcript_reads_finished_or_not() -> None:
    finished = ["What time is it?", "Where are you from?", "Yes, I do.", "你好。", "Hi!"]
    unfinished = ["Can you tell me where the", "I would like...", "He was not an ill-sp-",
                  "I want to go to the.", "So, um.", "Is it,"]  # fmt: skip
    assert all(text_complete(t) for t in finished)
    assert not any(text_complete(t) is not False for t in unfinished)
    assert text_complete("  ") is None and text_complete("10 of clubs") is None


def _speak(endpointer: ModelEndpointer, probs: list[float]) -> list[tuple[int, object]]:
    """(chunk index, event) of every event the chunks give."""
    events = []
    for index, prob in enumerate(probs):
        chunk = np.full(CHUNK, prob, np.float32)
        events += [(index, e) for e in endpointer.step(chunk, prob)]
    return events


SPEECH = [0.0] * 5 + [0.9] * 30
ASKS = [round(s / CHUNK_S) for s in ASK_AT_S]  # chunks of silence: 3 and 19


def test_the_model_is_asked_at_short_pauses_and_a_complete_turn_ends_at_once() -> None:
    endpointer = ModelEndpointer(pause_s=ASK_AT_S[0])
    events = _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    kinds = [type(e).__name__ for _, e in events]
    assert kinds == ["SpeechStarted", "SpeechPaused", "AskTurnModel"]
    ask = events[-1][1]
    assert isinstance(ask, AskTurnModel) and ask.pause == 1
    assert len(ask.audio) == len(endpointer.audio())  # the utterance so far, its silence too
    (ended,) = endpointer.decide(0.9, ask.pause, "What time is it?")
    assert isinstance(ended, Utterance) and ended.ended_by == "audio"
    assert endpointer.heard_s == 0.0  # a new utterance may start
    assert endpointer.decide(0.9, ask.pause, "What time is it?") == []  # a late second answer


def test_an_unfinished_turn_may_pause_longer_and_is_asked_again() -> None:
    endpointer = ModelEndpointer(incomplete_silence_s=1.4)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.95, 1, "Can you tell me where the") == []  # words unfinished
    events = _speak(endpointer, [0.0] * (ASKS[1] - ASKS[0]))
    assert [type(e) for _, e in events] == [AskTurnModel]  # asked again at 0.6 s
    assert endpointer.decide(0.2, 1, "Can you tell me where the") == []  # still unfinished
    silence = round(1.4 / CHUNK_S) - ASKS[1]
    events = _speak(endpointer, [0.0] * silence)
    ended = [e for _, e in events if isinstance(e, Utterance)]
    assert len(ended) == 1 and ended[0].ended_by == "silence"  # at 1.4 s, not 0.7 s
    assert [i for i, e in events if isinstance(e, Utterance)] == [silence - 1]


def test_the_words_are_read_without_case_or_punctuation() -> None:
    assert words("Can you tell me.") == words("can you tell me") == ["can", "you", "tell", "me"]
    assert words("I'm sure, it’s fine!") == ["im", "sure", "its", "fine"]
    assert features("...") is None and features("") is None
    row = features("Can you tell me.")
    assert row is not None and row.shape == (FEATURES,) and row.dtype == np.int64
    np.testing.assert_array_equal(row, features("can you tell me?"))
    assert not np.array_equal(row, features("you tell me"))  # the opener is a feature


def test_fused_answers_end_hold_or_leave_the_turn_to_silence() -> None:
    fusion = Fusion(words_weight=0.5, complete_at=0.6, unfinished_below=0.3,
                    unfinished_silence_s=2.0)  # fmt: skip
    # finished words, complete-sounding audio: ended at once, by the larger share
    endpointer = ModelEndpointer(fusion=fusion)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    (ended,) = endpointer.decide(0.5, 1, "Where is the pool?", words=0.9)
    assert isinstance(ended, Utterance) and ended.ended_by == "words"
    endpointer = ModelEndpointer(fusion=fusion)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.95, 1, "Where is the pool", words=0.4)[0].ended_by == "audio"
    # unfinished words: however finished the audio sounds, the speaker may pause 2 s
    endpointer = ModelEndpointer(fusion=fusion)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert not endpointer.holding  # asked, not answered: the silence rule for now
    assert endpointer.decide(0.99, 1, "Can you tell me.", words=0.1) == []
    assert endpointer.holding  # what the gateway starts a held reply on
    events = _speak(endpointer, [0.0] * (round(2.0 / CHUNK_S) - ASKS[0]))
    ended = [(i, e) for i, e in events if isinstance(e, Utterance)]
    assert [e.ended_by for _, e in ended] == ["silence"]
    assert ended[0][0] == round(2.0 / CHUNK_S) - ASKS[0] - 1  # at 2.0 s, not 0.7 s
    assert not endpointer.holding  # the turn ended: no pause held
    # held, then the speaker goes on: nothing is held any more
    endpointer = ModelEndpointer(fusion=fusion)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    endpointer.decide(0.99, 1, "Can you tell me.", words=0.1)
    _speak(endpointer, [0.9])
    assert not endpointer.holding
    # in between, both asks answered: the silence rule (0.7 s)
    endpointer = ModelEndpointer(fusion=fusion, end_silence_s=0.7)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.5, 1, "Where is the pool", words=0.5) == []
    assert not endpointer.holding  # the silence rule's wait, not a hold
    _speak(endpointer, [0.0] * (ASKS[1] - ASKS[0]))
    assert endpointer.decide(0.5, 1, "Where is the pool", words=0.5) == []
    events = _speak(endpointer, [0.0] * (round(0.7 / CHUNK_S) - ASKS[1]))
    assert [type(e) for _, e in events][-1] is Utterance


def test_audio_sure_enough_lifts_the_words_hold() -> None:
    """`audio_sure_at`: doubted words hold the turn unless the audio model is that sure;
    then the score decides, or the silence rule (0.7 s), not the 2-s hold."""
    fusion = Fusion(words_weight=0.5, complete_at=0.6, unfinished_below=0.3,
                    unfinished_silence_s=2.0, audio_sure_at=0.95)  # fmt: skip
    endpointer = ModelEndpointer(fusion=fusion)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.94, 1, "Can you tell me.", words=0.1) == []  # held
    assert endpointer.hold >= round(2.0 / CHUNK_S)
    endpointer = ModelEndpointer(fusion=fusion, end_silence_s=0.7)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.99, 1, "Can you tell me.", words=0.1) == []  # score 0.545
    _speak(endpointer, [0.0] * (ASKS[1] - ASKS[0]))
    assert endpointer.decide(0.99, 1, "Can you tell me.", words=0.1) == []  # asked again
    events = _speak(endpointer, [0.0] * (round(0.7 / CHUNK_S) - ASKS[1]))
    assert [e.ended_by for _, e in events if isinstance(e, Utterance)] == ["silence"]
    endpointer = ModelEndpointer(fusion=fusion)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.99, 1, "Where is the pool", words=0.25)[0].ended_by == "audio"
    with pytest.raises(ValueError, match="audio_sure_at"):
        Fusion(audio_sure_at=1.5)


def test_whisper_end_mark_is_read_with_the_words() -> None:
    """`end_mark_weight`: the words' answer is turn_words' and Whisper's end mark averaged
    in logit space; without either (or at weight 0) turn_words' alone."""
    fusion = Fusion(end_mark_weight=0.5)
    assert fusion.words(0.5, 0.9) == pytest.approx(0.75)  # logit 0 and logit(0.9) / 2 ...
    assert fusion.words(0.9, 0.1) == pytest.approx(0.5)  # ... cancel out
    assert fusion.words(0.4, None) == 0.4 and fusion.words(None, 0.9) is None
    assert Fusion(end_mark_weight=0.0).words(0.4, 0.99) == 0.4
    assert Fusion(end_mark_weight=1.0).words(0.01, 0.8) == pytest.approx(0.8)
    # a doubted head ("can you tell me.", turn_words 0.55) that Whisper heard unfinished
    # (end mark 0.1) is held; the same words heard as finished (0.95) end the turn
    held = Fusion(words_weight=0.7, complete_at=0.5, unfinished_below=0.5, end_mark_weight=0.7)
    endpointer = ModelEndpointer(fusion=held)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.9, 1, "Can you tell me.", words=0.55, end_mark=0.1) == []
    assert endpointer.hold >= round(held.unfinished_silence_s / CHUNK_S)
    endpointer = ModelEndpointer(fusion=held)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    (ended,) = endpointer.decide(0.9, 1, "Can you tell me.", words=0.55, end_mark=0.95)
    assert isinstance(ended, Utterance) and ended.ended_by == "words"
    with pytest.raises(ValueError, match="end_mark_weight"):
        Fusion(end_mark_weight=-0.5)


def test_either_reader_finishing_the_words_lifts_the_hold() -> None:
    """`end_mark_rule` "either": the words' answer is the larger of turn_words' and
    Whisper's end mark, so the turn is held only where both doubt it."""
    either = Fusion(end_mark_rule="either")
    assert either.words(0.2, 0.9) == 0.9 and either.words(0.8, 0.3) == 0.8
    assert either.words(0.4, None) == 0.4
    # a long read sentence turn_words doubts (0.23) that Whisper heard end (0.93): not held
    endpointer = ModelEndpointer(fusion=either)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    (ended,) = endpointer.decide(0.9, 1, "than he was.", words=0.23, end_mark=0.93)
    assert isinstance(ended, Utterance) and ended.ended_by == "words"
    # a head both doubt ("Can you tell me", 0.3 and 0.2): held
    endpointer = ModelEndpointer(fusion=either)
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.9, 1, "Can you tell me?", words=0.3, end_mark=0.2) == []
    assert endpointer.hold >= round(either.unfinished_silence_s / CHUNK_S)
    with pytest.raises(ValueError, match="end_mark_rule"):
        Fusion(end_mark_rule="product")


def test_without_a_words_answer_the_transcript_is_read_by_rule() -> None:
    endpointer = ModelEndpointer(fusion=Fusion(complete_at=0.01))
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])
    assert endpointer.decide(0.99, 1, "Can you tell me where the", words=None) == []


@pytest.mark.parametrize("weight", [-0.1, 1.5])
def test_a_fusion_out_of_range_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="words_weight"):
        Fusion(words_weight=weight)


def _ended_at(events: list[tuple[int, object]]) -> list[int]:
    return [i for i, e in events if isinstance(e, Utterance)]


def test_the_silence_rule_waits_for_an_answer_on_its_way_and_no_longer() -> None:
    wait = round(1.2 / CHUNK_S)
    # asked, never answered (an overloaded server): the silence rule waits 1.2 s, not 0.7
    endpointer = ModelEndpointer(end_silence_s=0.7, answer_wait_s=1.2)
    events = _speak(endpointer, SPEECH + [0.0] * wait)
    assert _ended_at(events) == [len(SPEECH) + wait - 1]
    assert events[-1][1].ended_by == "silence"
    # a late answer that the words are unfinished holds the pause as an early one would
    endpointer = ModelEndpointer(end_silence_s=0.7, answer_wait_s=1.2,
                                 fusion=Fusion(unfinished_silence_s=1.8))  # fmt: skip
    late, hold = round(0.9 / CHUNK_S), round(1.8 / CHUNK_S)
    _speak(endpointer, SPEECH + [0.0] * late)
    assert endpointer.decide(0.99, 1, "Can you tell me.", words=0.05) == []
    assert endpointer.decide(0.99, 1, "Can you tell me.", words=0.05) == []
    events = _speak(endpointer, [0.0] * hold)
    assert _ended_at(events) == [hold - late - 1]  # at 1.8 s of silence
    # an ask that failed answers None: the 0.7-s rule, at once when it is past
    endpointer = ModelEndpointer(end_silence_s=0.7, answer_wait_s=1.2)
    _speak(endpointer, SPEECH + [0.0] * round(0.9 / CHUNK_S))
    assert endpointer.decide(None, 1) == [] and endpointer.decide(None, 1) == []
    assert _ended_at(_speak(endpointer, [0.0])) == [0]


def test_an_answer_about_a_pause_the_speaker_ended_is_ignored() -> None:
    endpointer = ModelEndpointer()
    _speak(endpointer, SPEECH + [0.0] * ASKS[0])  # asked about pause 1
    _speak(endpointer, [0.9] * 10)  # speech resumed
    assert endpointer.decide(0.99, 1, "Hello.") == []
    _speak(endpointer, [0.0] * ASKS[0])  # pause 2
    assert endpointer.decide(0.99, 1, "Hello.") == []  # still about pause 1
    assert isinstance(endpointer.decide(0.99, 2, "Hello.")[0], Utterance)


def test_a_click_that_the_model_calls_complete_is_too_short() -> None:
    endpointer = ModelEndpointer(min_speech_s=0.25)
    _speak(endpointer, [0.0] * 5 + [0.9] * 3 + [0.0] * ASKS[0])
    assert [type(e) for e in endpointer.decide(0.99, 1, None)] == [TooShort]


def test_the_silence_endpointer_never_asks() -> None:
    from avatar.endpointing import Endpointer

    endpointer = Endpointer(pause_s=0.2)
    events = [e for p in SPEECH + [0.0] * 30 for e in endpointer.step(np.zeros(CHUNK), p)]
    assert not any(isinstance(e, AskTurnModel) for e in events)
    assert any(isinstance(e, SpeechPaused) for e in events)
    assert endpointer.decide(0.99, 1, "Hello.") == []


# ---------------------------------------------------------------- the served model


def test_the_served_model_answers_as_its_export_in_batches(triton_server) -> None:
    import tritonclient.grpc as grpcclient

    from export.common import onnx_session
    from export.registry import ensure_all

    clips = human_clips()[:3]
    features = np.stack([turn_features(c.audio) for c in clips])
    session = onnx_session(ensure_all(["turn_detector"])["turn_detector"] / "model.onnx")
    expected = session.run(["probability"], {"input_features": features})[0]
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        assert client.is_model_ready("turn_detector")
        tensor = grpcclient.InferInput("input_features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        result = client.infer("turn_detector", [tensor])
        got = result.as_numpy("probability")
        assert got.shape == (3, 1) and np.all((got >= 0) & (got <= 1))
        np.testing.assert_allclose(got, expected, atol=1e-5)
        wrong = grpcclient.InferInput("input_features", [1, 80, 400], "FP32")  # 4 s of frames
        wrong.set_data_from_numpy(np.zeros((1, 80, 400), np.float32))
        with pytest.raises(Exception, match="800"):
            client.infer("turn_detector", [wrong])
        assert client.is_model_ready("turn_detector")  # and it serves on


def test_the_served_words_model_answers_as_its_export_in_batches(triton_server) -> None:
    import tritonclient.grpc as grpcclient

    from export.common import onnx_session
    from export.registry import ensure_all

    texts = ["Can you tell me", "Where is the nearest pharmacy?", "I would like to"]
    rows = np.stack([features(t) for t in texts])
    session = onnx_session(ensure_all(["turn_words"])["turn_words"] / "model.onnx")
    expected = session.run(["probability"], {"features": rows})[0]
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        tensor = grpcclient.InferInput("features", list(rows.shape), "INT64")
        tensor.set_data_from_numpy(rows)
        got = client.infer("turn_words", [tensor]).as_numpy("probability")
        assert got.shape == (3, 1)
        np.testing.assert_allclose(got, expected, atol=1e-6)
        assert got[1, 0] > 0.5 > got[2, 0]  # a finished question, a verb left waiting
        wrong = grpcclient.InferInput("features", [1, 4], "INT64")
        wrong.set_data_from_numpy(np.zeros((1, 4), np.int64))
        with pytest.raises(Exception, match="10"):
            client.infer("turn_words", [wrong])
        assert client.is_model_ready("turn_words")  # and it serves on


def test_the_gateway_ends_a_finished_question_by_the_model(gateway: str) -> None:
    """A clear question with the silence rule at its longest (2 s): the model (asked at
    0.2 s) and the transcript end it long before that."""
    from clients.live import converse
    from evals.clips import clips

    clip = clips()[1]  # "What time does the museum open on Sunday?"
    url = gateway.replace("http://", "ws://") + "/ws"
    reply = asyncio.run(converse(url, clip.audio, controls={"seed": 1, "end_silence_s": 2.0}))
    assert not reply.of("error"), reply.of("error")
    (end,) = [m for m in reply.of("speech_end") if m["utterance_s"] > 0]
    assert end["ended_by"] in ("audio", "words")
    spoken_s = len(clip.audio) / 16_000
    assert end["utterance_s"] < spoken_s + 1.5  # pre-roll and silence: well under 2 s
