"""Live-audio turn taking for `clients.chat --mic`: utterances cut by the served VAD model
from a stream of 32-ms chunks (recorded speech stands in for the microphone here)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from avatar.endpointing import Endpointer
from avatar.vad import CHUNK, SAMPLE_RATE, chunks
from clients.microphone import _sounddevice, listen

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def two_questions() -> tuple[np.ndarray, list[int]]:
    """Silence, a question, 1.2 s of silence, another question, silence; speech lengths."""
    from avatar.audio import reference_speech

    first = reference_speech("What is your name?")
    second = reference_speech("Where is the station?")
    gap = np.zeros(int(1.2 * SAMPLE_RATE), np.float32)
    audio = np.concatenate([gap[:8000], first, gap, second, gap])
    return audio, [first.size, second.size]


def test_utterances_are_cut_at_the_pauses(triton_server, two_questions):
    audio, lengths = two_questions
    source = iter(chunks(audio))
    got = [listen(triton_server.grpc_url, source) for _ in lengths]
    assert listen(triton_server.grpc_url, source) is None  # only silence was left
    for utterance, speech in zip(got, lengths, strict=True):
        assert utterance is not None
        # the whole question, plus at most the pre-roll and the end-of-turn silence
        assert speech <= utterance.size <= speech + int(1.2 * SAMPLE_RATE), utterance.size


def test_short_clicks_are_not_utterances_and_long_speech_is_cut():
    endpointer = Endpointer(min_speech_s=0.25, max_utterance_s=2.0, end_silence_s=0.3)
    chunk = np.zeros(CHUNK, np.float32)
    click = [0.9] * 3 + [0.0] * 20  # ~0.1 s of "speech"
    assert all(endpointer.push(chunk, p) is None for p in click)
    monologue = [endpointer.push(chunk, 0.9) for _ in range(200)]
    cut = [u for u in monologue if u is not None]
    assert cut and all(u.size <= 2.0 * SAMPLE_RATE + 2 * CHUNK for u in cut)


@pytest.mark.skipif(
    importlib.util.find_spec("sounddevice") is not None, reason="sounddevice is installed"
)
def test_missing_audio_library_says_what_to_install():
    with pytest.raises(RuntimeError, match="pip install sounddevice"):
        _sounddevice()
