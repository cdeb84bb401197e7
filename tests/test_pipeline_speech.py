"""avatar.pipeline.speech: joining a TTS stream into one utterance, animating it."""

from __future__ import annotations

import numpy as np
import pytest

from avatar.errors import RequestError
from avatar.pipeline import Controls, Speech
from avatar.pipeline.speech import animate_utterance, join_speech


def piece(seconds: float, text: str) -> Speech:
    edges = np.linspace(0.0, seconds, 4)
    return Speech(
        np.ones(int(seconds * 100), np.float32), 100, ["^", "m", "a"], edges[:-1], edges[1:], text
    )


def test_join_shifts_phonemes_onto_one_clock():
    speech = join_speech([piece(1.0, "One."), piece(0.5, "Two.")])
    assert speech.audio.size == 150 and speech.sample_rate == 100
    assert speech.phonemes == ["^", "m", "a"] * 2 and speech.text == "One. Two."
    assert speech.starts[3] == pytest.approx(1.0) and speech.ends[-1] == pytest.approx(1.5)


def test_join_nothing_is_an_error():
    with pytest.raises(RequestError, match="no speech"):
        join_speech([])


def test_animate_utterance_covers_the_audio():
    speech = join_speech([piece(1.0, "One."), piece(0.5, "Two.")])
    animation = animate_utterance(
        speech.phonemes, speech.starts, speech.ends, 1.5, Controls(fps=20)
    )
    assert animation.blendshapes.shape == (31, 52) and animation.times[-1] == pytest.approx(1.5)


def test_animate_utterance_checks_lengths():
    with pytest.raises(RequestError, match="same length"):
        animate_utterance(["a"], np.zeros(2), np.ones(2), None, Controls())
