"""Sentence sets with known texts, fixed order (the order is part of what the gates and
caches key on).

- `avatar/animation/emotion_sentences.json`: assistant-style reply sentences written for
  this project, per emotion label; its 'train' split fits and calibrates, its 'heldout' split
  (another register, written separately) only evaluates. `load_sentences` gives them with
  their labels in `tables.EMOTIONS` order (the emotion classifier), `sentences` flat in
  label-name order (lipsync, ASR long-form and LLM sets).
- `WER_SENTENCES`: held-out sentences the TTS speaks for its intelligibility figure.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from avatar.animation import tables
from avatar.animation.emotion_classifier import SENTENCES_PATH

WER_SENTENCES = (
    "The library closes early on public holidays.",
    "My neighbor grows tomatoes and peppers in her garden.",
    "Turn left after the bridge and follow the river.",
    "The pilot announced a short delay because of fog.",
    "Children were playing football in the park after school.",
    "He forgot his umbrella and got soaked in the rain.",
    "Fresh coffee is the best way to start a busy morning.",
    "The museum opened a new exhibition about ancient Egypt.",
    "Please send me the report before the end of the week.",
    "A small cat was sleeping on the warm windowsill.",
    "The mountain road is closed during the winter months.",
    "She plays the violin in the city orchestra.",
    "We watched the sunset from the top of the hill.",
    "The doctor asked him to drink more water every day.",
    "Our team won the match in the final minute.",
    "The bakery on the corner sells delicious cinnamon rolls.",
    "Strong winds knocked down several trees last night.",
    "I would like a table for two near the window.",
    "The students listened carefully to the history lecture.",
    "Remember to switch off the lights when you leave.",
    "The farmer drove his tractor across the muddy field.",
    "Many birds fly south when the weather turns cold.",
    "The train to the airport leaves every twenty minutes.",
    "He painted the fence white over the long weekend.",
)


def load_sentences(path: Path = SENTENCES_PATH) -> dict[str, tuple[list[str], np.ndarray]]:
    """{"train"|"heldout": (sentences, label indices into tables.EMOTIONS)}."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if tuple(data["labels"]) != tables.EMOTIONS:
        raise ValueError(f"{path} labels {data['labels']} differ from {tables.EMOTIONS}")
    out = {}
    for split in ("train", "heldout"):
        texts: list[str] = []
        ys: list[int] = []
        for k, label in enumerate(tables.EMOTIONS):
            texts += data[split][label]
            ys += [k] * len(data[split][label])
        out[split] = (texts, np.array(ys))
    overlap = set(out["train"][0]) & set(out["heldout"][0])
    if overlap:
        raise ValueError(f"held-out sentences also in training: {sorted(overlap)}")
    return out


def sentences(split: str) -> list[str]:
    """The 'train' or 'heldout' sentences of emotion_sentences.json, in a fixed order."""
    data = json.loads(SENTENCES_PATH.read_text(encoding="utf-8"))[split]
    return [s for label in sorted(data) for s in data[label]]
