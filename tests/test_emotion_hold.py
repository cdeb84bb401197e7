"""A face that does not flicker (issue 34, item 5): the emotion holds across the sentences
of a turn and across turns unless the classifier is clearly confident of a change; measured
on ordinary small-talk replies with the real classifier (training/emotion/flicker.py)."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from avatar.animation.emotion_hold import (
    HoldConfig,
    Mood,
    Moods,
    changes_per_sentence,
    held_labels,
    hold,
)
from avatar.pipeline import PipelineConfig, SentenceEvent, Speech, Stages, parse_turn, run_turn
from avatar.pipeline.request import Controls
from avatar.pipeline.turn import held_emotion

log = logging.getLogger(__name__)

# the goal of issue 34: at most one change in three sentences of small talk
MAX_CHANGES_PER_SENTENCE = 1 / 3


def test_weak_changes_hold_and_strong_ones_pass() -> None:
    happy = Mood("happy", 0.95)
    assert hold(happy, "afraid", 0.6) == Mood("happy", pytest.approx(0.665))  # weak: held
    assert hold(happy, "sad", 0.97) == Mood("sad", 0.97)  # clearly confident: at once
    assert hold(Mood(), "sad", 0.97) == Mood("sad", 0.97)
    assert hold(Mood(), "happy", 0.1) == Mood()  # barely above chance: stays neutral
    # neutral sentences let an emotion fade, then the face is neutral again
    faded = held_labels([("neutral", 0.0)] * 4, happy)
    assert [m.label for m in faded] == ["happy", "happy", "happy", "neutral"]
    assert faded[0].level > faded[1].level > faded[2].level


def test_changes_per_sentence() -> None:
    assert changes_per_sentence([]) == 0.0
    assert changes_per_sentence(["happy", "happy", "sad"]) == pytest.approx(1 / 3)


def test_moods_are_kept_per_session_and_bounded() -> None:
    moods = Moods(capacity=2)
    moods.put("a", Mood("happy", 0.9))
    moods.put("b", Mood("sad", 0.9))
    moods.put("", Mood("angry", 1.0))  # no session: nothing to keep
    assert moods.get("a").label == "happy" and moods.get("").label == "neutral"
    moods.put("c", Mood())  # "b" was used least recently
    assert moods.get("b") == Mood() and moods.get("a").label == "happy"
    with pytest.raises(ValueError, match="switch"):
        HoldConfig(switch=1.5)


class Turns:
    """A fake LLM that says each turn's sentences; a classifier read from a table."""

    def __init__(self, readings: dict[str, tuple[str, float]]) -> None:
        self.readings, self.reply = readings, [""]

    def stages(self) -> Stages:
        def chat(text, request, stop):
            yield from self.reply
            return {}

        def speak(text, request):
            yield Speech(
                np.zeros(2205, np.float32), 22050, ["a"], np.zeros(1), np.full(1, 0.1), text
            )

        return Stages(lambda audio: "", chat, speak, feel=self.readings.__getitem__)


def test_the_mood_is_held_across_turns_of_a_session() -> None:
    turns = Turns(
        {
            "Happy birthday!": ("happy", 1.0),
            "Have a safe trip!": ("afraid", 0.6),  # a misreading of small talk
            "The spa is upstairs.": ("neutral", 0.0),
            "I'm so sorry for your loss.": ("sad", 0.98),
        }
    )
    stages = turns.stages()

    def say(session: str, *sentences: str) -> list[str]:
        turns.reply = list(sentences)
        events: list = []
        run_turn(parse_turn(None, "hi", session, ""), stages, events.append, lambda: "")
        return [e.emotion for e in events if isinstance(e, SentenceEvent)]

    assert say("s1", "Happy birthday!") == ["happy"]
    assert say("s1", "Have a safe trip!", "The spa is upstairs.") == ["happy", "happy"]
    assert say("s2", "Have a safe trip!") == ["afraid"]  # another session starts neutral
    assert say("s1", "I'm so sorry for your loss.") == ["sad"]  # a strong change passes
    config = dataclasses.replace(PipelineConfig(), max_sentences=0)
    assert config.hold == HoldConfig()


def test_a_fixed_emotion_control_is_not_held() -> None:
    fixed = Controls(emotion="angry", intensity=0.4)
    controls, mood = held_emotion("Hi.", fixed, lambda t: ("happy", 1.0), Mood("sad", 0.9))
    assert controls == fixed and mood == Mood("sad", 0.9)


def test_flicker_on_small_talk_and_heldout_accuracy() -> None:
    """The real classifier on 38 small-talk replies (115 sentences, one conversation):
    label changes per sentence before and after the hold, and the held-out accuracy of
    the shown label (`python -m training.emotion.flicker` logs the same figures)."""
    pytest.importorskip("torch")
    from avatar.animation.emotion_classifier import EmotionClassifier
    from networks.sentence_encoder import SentenceEncoder
    from training.emotion.flicker import measure

    figures = measure(EmotionClassifier.load(encoder=SentenceEncoder().encode))
    log.info("flicker figures: %s", figures)  # shown with --log-cli-level=INFO
    assert figures.replies >= 30 and figures.sentences >= 90
    assert figures.raw_changes > MAX_CHANGES_PER_SENTENCE  # the flicker the issue saw
    assert figures.held_changes <= MAX_CHANGES_PER_SENTENCE
    assert figures.held_changes_within <= figures.held_changes
    # a strongly emotional single sentence still gets its label: no held-out label lost
    assert figures.held_accuracy >= figures.raw_accuracy - 1e-9 and figures.held_accuracy >= 0.8
