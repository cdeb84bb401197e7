"""Sentence emotion classifier: committed weights, clear examples, held-out accuracy, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from avatar.animation import tables
from avatar.animation.emotion import emotion_vector
from avatar.animation.emotion_classifier import WEIGHTS_PATH, EmotionClassifier
from avatar.errors import RequestError
from evals.sentences import load_sentences

# Measured 0.886 (93/105) by `python -m training.emotion.train --evaluate`; margin for
# numerical drift across torch/transformers versions and CPUs.
HELDOUT_ACCURACY_MIN = 0.80


@pytest.fixture(scope="module")
def classifier() -> EmotionClassifier:
    from networks.sentence_encoder import SentenceEncoder

    return EmotionClassifier.load(encoder=SentenceEncoder().encode)


def test_weights_are_small_and_match_the_facs_table(classifier: EmotionClassifier) -> None:
    assert WEIGHTS_PATH.stat().st_size < 64 * 1024
    assert classifier.labels == tables.EMOTIONS
    assert classifier.weights.shape == (384, len(tables.EMOTIONS))
    assert classifier.temperature > 0


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("I'm so happy to see you!", "happy"),
        ("I'm sorry for your loss.", "sad"),
        ("The store opens at nine tomorrow morning.", "neutral"),
        ("This is outrageous, how dare they lie to us!", "angry"),
        ("Wow, I never expected that!", "surprised"),
        ("I'm scared, there's someone in the house.", "afraid"),
        ("Ew, this food is rotten and smells disgusting.", "disgusted"),
    ],
)
def test_clear_examples(classifier: EmotionClassifier, text: str, label: str) -> None:
    emotion = classifier.predict(text)
    assert emotion.label == label, emotion
    assert sum(emotion.probabilities.values()) == pytest.approx(1.0, abs=1e-5)


def test_intensity_in_range_and_usable_by_the_facs_blend(classifier: EmotionClassifier) -> None:
    neutral, happy = classifier.predict_batch(
        ["Your package ships on Monday.", "Congratulations, that's wonderful news!"]
    )
    assert neutral.label == "neutral" and neutral.intensity == 0.0
    assert happy.label == "happy" and 0.5 < happy.intensity <= 1.0
    for e in (neutral, happy):
        vec = emotion_vector(e.label, e.intensity)
        assert vec.shape == (len(tables.ARKIT_NAMES),)
    assert not np.any(emotion_vector(neutral.label, neutral.intensity))


def test_heldout_accuracy(classifier: EmotionClassifier) -> None:
    data = load_sentences()
    texts, y = data["heldout"]
    assert not set(texts) & set(data["train"][0])
    predicted = [tables.EMOTIONS.index(e.label) for e in classifier.predict_batch(texts)]
    accuracy = float(np.mean(np.array(predicted) == y))
    assert accuracy >= HELDOUT_ACCURACY_MIN, accuracy


@pytest.mark.parametrize("text", ["", "   \n", None, 3])
def test_bad_input_is_a_request_error(classifier: EmotionClassifier, text: object) -> None:
    with pytest.raises(RequestError):
        classifier.predict(text)  # type: ignore[arg-type]


def test_empty_batch(classifier: EmotionClassifier) -> None:
    assert classifier.predict_batch([]) == []


def test_served_encoder_export_matches_pytorch() -> None:
    """The `emotion_encoder` artifact: verified at export (embeddings within 1e-4 of
    PyTorch, every held-out label the same), and the runtime tokenizer gives the ids
    transformers gives."""
    from transformers import AutoTokenizer

    from avatar.animation.emotion_classifier import SentenceTokenizer, model_dir
    from export.registry import ensure_all
    from export.sidecar import Sidecar

    folder = ensure_all(["emotion_encoder"])["emotion_encoder"]
    validation = Sidecar.load(folder).validation
    held = len(load_sentences()["heldout"][0])
    assert validation["heldout_labels_same"] == f"{held}/{held}"
    assert validation["outputs"]["embedding"]["max_abs"] <= 1e-4
    texts = ["Hi!", "The lobby is on the left, next to the elevators. Ça va?"]
    ours = SentenceTokenizer()(texts)
    theirs = AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)(
        texts, padding=True, truncation=True, max_length=128, return_tensors="np"
    )
    assert np.array_equal(ours["input_ids"], theirs["input_ids"])
    assert np.array_equal(ours["attention_mask"], theirs["attention_mask"])


def test_int8_variant_gate_is_recorded_and_recomputes() -> None:
    """The INT8 Q/DQ variant's gate record (labels, accuracy, intensity against FP32 on the
    held-out sentences) is in the sidecar with its calibration set, and the gate computed
    again on the built files gives the same verdict and quality figures."""
    import json

    from evals import emotion
    from export.emotion import int8
    from export.registry import ensure_all
    from export.sidecar import Sidecar

    folder = ensure_all(["emotion_encoder"])["emotion_encoder"]
    record = Sidecar.load(folder).validation["variants"][int8.VARIANT_FILE]
    calibration = json.loads((folder / int8.CALIBRATION_FILE).read_text())
    assert calibration["sentences"] == list(load_sentences()["train"][0])
    again = int8.gate(folder / "model.onnx", folder / int8.VARIANT_FILE)
    for key in ("passes_gate", "accuracy", "labels_as_fp32", "intensity_mad"):
        assert again[key] == record[key], key
    assert record["passes_gate"] == (
        record["accuracy"]["int8"] >= record["accuracy"]["fp32"] - emotion.ACCURACY_DROP
        and record["labels_as_fp32"] >= emotion.MIN_AGREEMENT
        and record["intensity_mad"] <= emotion.MAX_INTENSITY_MAD
    )
    assert set(record["speed_1_thread"]) == {"batch_1", "batch_8"}
