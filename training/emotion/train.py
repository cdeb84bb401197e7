"""Train the sentence emotion classifier: `python -m training.emotion.train [--evaluate]`.

Data: `avatar/animation/emotion_sentences.json`, assistant-style reply sentences written for
this project, 40 per label (the 7 of `tables.EMOTIONS`) for training, and a held-out set
written separately (15 per label, a different register: short chat lines, fragments,
exclamations) that is never used for fitting or for choosing anything.

Model: multinomial logistic regression (numpy, full-batch Adam with an L2
penalty) over the 384-d all-MiniLM-L6-v2 embeddings of `avatar.animation.emotion_classifier`.
The penalty is chosen by 5-fold cross-validation on the training sentences, the softmax
temperature from the same folds' out-of-fold logits (minimum NLL); then the model is refit
on all training sentences and saved to `avatar/animation/emotion_weights.npz`.

The report (held-out accuracy, confusion matrix, per-label recall) goes to the log.
`--evaluate` only scores the committed weights on the held-out sentences.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

from avatar.animation import tables
from avatar.animation.emotion_classifier import (
    WEIGHTS_PATH,
    EmotionClassifier,
    softmax,
)
from evals.sentences import load_sentences
from networks.sentence_encoder import SentenceEncoder

log = logging.getLogger("training.emotion.train")

SEED = 1234
FOLDS = 5
L2_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
TEMPERATURE_GRID = tuple(float(t) for t in np.round(np.geomspace(0.02, 5.0, 61), 4))
STEPS = 1500
LEARNING_RATE = 0.05


def fit(x: np.ndarray, y: np.ndarray, n_labels: int, l2: float) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression: Adam on mean cross-entropy + l2 * |W|^2 -> (W, b)."""
    n, d = x.shape
    onehot = np.eye(n_labels)[y]
    params = [np.zeros((d, n_labels)), np.zeros(n_labels)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    for step in range(1, STEPS + 1):
        w, b = params
        err = (softmax(x @ w + b) - onehot) / n
        grads = [x.T @ err + 2.0 * l2 * w, err.sum(0)]
        for i, g in enumerate(grads):
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            mhat = m[i] / (1 - beta1**step)
            vhat = v[i] / (1 - beta2**step)
            params[i] = params[i] - LEARNING_RATE * mhat / (np.sqrt(vhat) + eps)
    return params[0], params[1]


def nll(logits: np.ndarray, y: np.ndarray, temperature: float) -> float:
    p = softmax(logits / temperature)
    return float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())


def cross_validate(x: np.ndarray, y: np.ndarray, n_labels: int) -> tuple[float, float, float]:
    """(l2, temperature, out-of-fold accuracy) from a stratified k-fold on the training set."""
    rng = np.random.default_rng(SEED)
    fold = np.empty(len(y), dtype=int)
    for k in range(n_labels):  # stratified: each label's sentences spread over the folds
        idx = rng.permutation(np.flatnonzero(y == k))
        fold[idx] = np.arange(len(idx)) % FOLDS
    best: tuple[float, float, float, np.ndarray] | None = None
    for l2 in L2_GRID:
        logits = np.zeros((len(y), n_labels))
        for f in range(FOLDS):
            w, b = fit(x[fold != f], y[fold != f], n_labels, l2)
            logits[fold == f] = x[fold == f] @ w + b
        acc = float((logits.argmax(1) == y).mean())
        loss = min(nll(logits, y, t) for t in TEMPERATURE_GRID)
        log.info("cv l2=%g: out-of-fold accuracy %.3f, best-T NLL %.3f", l2, acc, loss)
        if best is None or (acc, -loss) > (best[0], -best[1]):
            best = (acc, loss, l2, logits)
    assert best is not None
    acc, _, l2, logits = best
    temperature = min(TEMPERATURE_GRID, key=lambda t: nll(logits, y, t))
    return l2, temperature, acc


def report(clf: EmotionClassifier, x: np.ndarray, y: np.ndarray, texts: list[str]) -> float:
    """Log held-out accuracy, the confusion matrix and the misclassified sentences."""
    probs = clf.probabilities(x)
    pred = probs.argmax(1)
    acc = float((pred == y).mean())
    k = len(clf.labels)
    confusion = np.zeros((k, k), dtype=int)
    np.add.at(confusion, (y, pred), 1)
    width = max(len(s) for s in clf.labels) + 1
    lines = [
        "rows = true, columns = predicted",
        " " * width + "".join(f"{s[:7]:>8}" for s in clf.labels),
    ]
    for i, label in enumerate(clf.labels):
        recall = confusion[i, i] / max(confusion[i].sum(), 1)
        cells = "".join(f"{c:>8d}" for c in confusion[i])
        lines.append(f"{label:<{width}}{cells}   recall {recall:.2f}")
    log.info("held-out accuracy %.3f (%d/%d sentences)", acc, int((pred == y).sum()), len(y))
    log.info("confusion matrix:\n%s", "\n".join(lines))
    for i in np.flatnonzero(pred != y):
        log.info(
            "  wrong: %-50r true %-9s predicted %-9s p=%.2f",
            texts[i], clf.labels[y[i]], clf.labels[pred[i]], probs[i, pred[i]],
        )  # fmt: skip
    return acc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.emotion.train", description=__doc__)
    parser.add_argument("--evaluate", action="store_true", help="only score the saved weights")
    parser.add_argument("--out", type=Path, default=WEIGHTS_PATH, help="weights file (.npz)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)

    data = load_sentences()
    encoder = SentenceEncoder()
    (train_texts, y_train), (held_texts, y_held) = data["train"], data["heldout"]
    x_held = encoder.encode(held_texts)
    if args.evaluate:
        report(EmotionClassifier.load(args.out, encoder.encode), x_held, y_held, held_texts)
        return 0

    x_train = encoder.encode(train_texts)
    n_labels = len(tables.EMOTIONS)
    log.info("training on %d sentences, %d held out", len(y_train), len(y_held))
    l2, temperature, cv_acc = cross_validate(x_train, y_train, n_labels)
    log.info("chose l2=%g, temperature %.2f (cv accuracy %.3f)", l2, temperature, cv_acc)
    w, b = fit(x_train, y_train, n_labels, l2)
    clf = EmotionClassifier(w, b, tables.EMOTIONS, temperature, encoder.encode)
    train_acc = float((clf.probabilities(x_train).argmax(1) == y_train).mean())
    log.info("training accuracy %.3f", train_acc)
    held_acc = report(clf, x_held, y_held, held_texts)
    np.savez(
        args.out,
        weights=clf.weights,
        bias=clf.bias,
        labels=np.array(clf.labels),
        temperature=np.float32(temperature),
        l2=np.float32(l2),
        seed=np.int32(SEED),
        cv_accuracy=np.float32(cv_acc),
        heldout_accuracy=np.float32(held_acc),
        embedding=np.array("sentence-transformers/all-MiniLM-L6-v2, mean pooling, L2-normalised"),
    )
    log.info("saved %s (%d bytes)", args.out, args.out.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
