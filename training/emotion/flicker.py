"""How often the face's emotion changes, per sentence, on ordinary small talk, without and
with the hysteresis of `avatar.animation.emotion_hold`; and the held-out accuracy of the
labels the face shows (each held-out sentence from a fresh, neutral conversation).

`python -m training.emotion.flicker` logs the figures. The replies
(`small_talk_replies.json`, written for this project, never used for training) are split
with the LLM stream's sentence splitter and read as one conversation, in order, so a change
between the last sentence of a reply and the first of the next counts too (the state is
kept per session across turns).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from avatar.animation import tables
from avatar.animation.emotion_classifier import EmotionClassifier
from avatar.animation.emotion_hold import (
    DEFAULT_HOLD,
    HoldConfig,
    Mood,
    changes_per_sentence,
    held_labels,
)
from avatar.sentences import split_sentences
from evals.sentences import load_sentences

log = logging.getLogger("training.emotion.flicker")

REPLIES_PATH = Path(__file__).with_name("small_talk_replies.json")


def small_talk_replies() -> list[list[str]]:
    """The replies, each as its sentences."""
    replies = json.loads(REPLIES_PATH.read_text(encoding="utf-8"))["replies"]
    return [split_sentences(reply) for reply in replies]


@dataclasses.dataclass(frozen=True)
class Flicker:
    sentences: int
    replies: int
    raw_changes: float  # per sentence, the classifier's own label on every sentence
    held_changes: float  # per sentence, the held label, across turns
    held_changes_within: float  # per sentence, counting changes inside a reply only
    raw_accuracy: float  # held-out sentences, classifier label
    held_accuracy: float  # held-out sentences, the label shown from a neutral start


def _within(readings: Sequence[Sequence[tuple[str, float]]], config: HoldConfig) -> float:
    changes = sentences = 0
    for reply in readings:
        labels = [m.label for m in held_labels(reply, Mood(), config)]
        changes += sum(a != b for a, b in itertools.pairwise(labels))
        sentences += len(labels)
    return changes / max(sentences, 1)


def measure(classifier: EmotionClassifier, config: HoldConfig = DEFAULT_HOLD) -> Flicker:
    """The flicker and accuracy figures of `classifier` with the hold `config`."""
    replies = small_talk_replies()
    readings = [[(e.label, e.intensity) for e in classifier.predict_batch(r)] for r in replies]
    flat = [reading for reply in readings for reading in reply]
    texts, truth = load_sentences()["heldout"]
    heldout = classifier.predict_batch(list(texts))
    shown = [held_labels([(e.label, e.intensity)], Mood(), config)[0].label for e in heldout]
    index = tables.EMOTIONS.index
    return Flicker(
        sentences=len(flat),
        replies=len(replies),
        raw_changes=changes_per_sentence([label for label, _ in flat]),
        held_changes=changes_per_sentence([m.label for m in held_labels(flat, Mood(), config)]),
        held_changes_within=_within(readings, config),
        raw_accuracy=float(
            np.mean([index(e.label) == t for e, t in zip(heldout, truth, strict=True)])
        ),
        held_accuracy=float(np.mean([index(s) == t for s, t in zip(shown, truth, strict=True)])),
    )


def main(argv: list[str] | None = None) -> int:
    del argv  # no options
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    from networks.sentence_encoder import SentenceEncoder

    figures = measure(EmotionClassifier.load(encoder=SentenceEncoder().encode))
    log.info("small talk: %d replies, %d sentences", figures.replies, figures.sentences)
    log.info("label changes per sentence, classifier alone: %.3f", figures.raw_changes)
    log.info(
        "label changes per sentence, held: %.3f across turns, %.3f within replies",
        figures.held_changes,
        figures.held_changes_within,
    )
    log.info(
        "held-out accuracy: classifier %.3f, shown from a neutral start %.3f",
        figures.raw_accuracy,
        figures.held_accuracy,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
