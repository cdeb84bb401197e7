"""The endpointing state machine (avatar.endpointing.Endpointer) over scripted speech
probabilities: the events it emits, in order, with the audio they carry. No server."""

from __future__ import annotations

import numpy as np

from avatar.endpointing import (
    Endpointer,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TooShort,
    Utterance,
)
from avatar.vad import CHUNK, CHUNK_S


def _run(endpointer: Endpointer, probs: list[float]) -> list[tuple[int, object]]:
    """(chunk index, event) of every event; chunk i holds the value i everywhere."""
    return [
        (i, event)
        for i, prob in enumerate(probs)
        for event in endpointer.step(np.full(CHUNK, i, np.float32), prob)
    ]


def test_a_question_with_a_pause_inside() -> None:
    """Speech, a pause long enough to report (0.2 s) but not to end (0.7 s), more speech,
    then the end: started, paused, resumed, paused, utterance."""
    endpointer = Endpointer(end_silence_s=0.7, pre_roll_s=0.128, pause_s=0.2)
    probs = [0.0] * 10 + [0.9] * 20 + [0.0] * 8 + [0.9] * 10 + [0.0] * 30
    events = _run(endpointer, probs)
    kinds = [(i, type(e)) for i, e in events]
    pause = round(0.2 / CHUNK_S)  # 6 silent chunks
    end = round(0.7 / CHUNK_S)  # 22
    assert kinds == [
        (10, SpeechStarted),
        (30 + pause - 1, SpeechPaused),
        (38, SpeechResumed),
        (48 + pause - 1, SpeechPaused),
        (48 + end - 1, Utterance),
    ]
    first_pause, utterance = events[1][1], events[-1][1]
    # the audio so far: the pre-roll (4 chunks) and everything since, chunk by chunk
    assert np.array_equal(first_pause.audio[::CHUNK], np.arange(6, 30 + pause, dtype=np.float32))
    assert np.array_equal(utterance.audio[::CHUNK], np.arange(6, 48 + end, dtype=np.float32))
    assert not endpointer.speaking and endpointer.heard_s == 0 and endpointer.audio().size == 0


def test_speaking_and_heard_so_far_follow_the_speech() -> None:
    endpointer = Endpointer(pre_roll_s=0.0)
    seen = []
    for prob in [0.0, 0.9, 0.9, 0.2, 0.9]:
        endpointer.step(np.zeros(CHUNK, np.float32), prob)
        seen.append((endpointer.speaking, round(endpointer.heard_s / CHUNK_S)))
    # off below threshold - 0.15 counts as silence (0.2); speech so far counts every chunk
    assert seen == [(False, 0), (True, 1), (True, 2), (False, 3), (True, 4)]
    assert endpointer.audio().shape == (4 * CHUNK,)


def test_a_click_is_too_short_and_no_pause_is_reported_without_pause_s() -> None:
    endpointer = Endpointer(end_silence_s=0.3, min_speech_s=0.25)
    kinds = [type(e) for _, e in _run(endpointer, [0.9] * 3 + [0.0] * 20)]
    assert kinds == [SpeechStarted, TooShort]


def test_a_monologue_is_cut_and_speech_starts_again() -> None:
    endpointer = Endpointer(max_utterance_s=1.0, pre_roll_s=0.0)
    events = _run(endpointer, [0.9] * 40)
    kinds = [type(e) for _, e in events]
    assert kinds == [SpeechStarted, Utterance, SpeechStarted]
    assert events[1][1].audio.size == round(1.0 / CHUNK_S) * CHUNK


def test_end_silence_is_a_live_setting_and_push_gives_the_utterance() -> None:
    endpointer = Endpointer(end_silence_s=0.7)
    endpointer.set_end_silence(0.2)
    chunk = np.zeros(CHUNK, np.float32)
    got = [endpointer.push(chunk, p) for p in [0.9] * 10 + [0.0] * 6]
    assert all(u is None for u in got[:-1]) and got[-1] is not None


def test_a_pause_ask_hands_on_the_text_words_and_whisper_end_mark() -> None:
    """gateway.endpointing.TurnAsks: the audio's answer, what the pause's pass heard (its
    text and Whisper's end mark) and the words' answer on that text reach `answered`
    together; a pass that heard nothing gives neither text nor end mark."""
    import asyncio

    from avatar.endpointing import AskTurnModel
    from gateway.endpointing import TurnAsks
    from gateway.hearing import AtPause

    async def run(heard: AtPause | None) -> list[tuple]:
        answers: list[tuple] = []

        async def probability(audio: np.ndarray) -> float:
            return 0.9

        async def transcript() -> AtPause | None:
            return heard

        async def answered(*args) -> None:
            answers.append(args)

        async def words(text: str) -> float:
            return 0.55 if text == "Can you tell me?" else 0.0

        asks = TurnAsks(probability, transcript, answered, words)
        asks.ask(AskTurnModel(np.zeros(CHUNK, np.float32), 1))
        await asyncio.gather(*asks.tasks)
        return answers

    heard = AtPause("Can you tell me?", end_probability=0.12)
    assert asyncio.run(run(heard)) == [(0.9, 1, "Can you tell me?", 0.55, 0.12)]
    assert asyncio.run(run(None)) == [(0.9, 1, None, None, None)]
