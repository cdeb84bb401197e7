"""The packaged conversations -> the `turn_words` model: are the words so far a finished turn?

Trained here, deterministically, in about a minute on 2 cores, from two packages that
install offline (their data files are read; none of their code runs):

- `chitchat-dataset==0.9.0` (MIT): 7,168 English conversations between people, each
  message a few chat lines. A finished turn is the message up to the end of one of its lines
  ("Hello" | "How are you doing today?"); an unfinished one is the message cut inside a line
  at a word that no sentence mark follows ("How are you" | "doing today?").
- `chatterbot-corpus==1.3.3` (BSD): short English dialogs (questions and answers to a
  bot, which is what an avatar hears), the same way.

The model is a logistic regression over the hashed features of avatar/turn_words.py
(ONNX: Gather the weights of the features, sum, add the bias, sigmoid). Conversations whose
index is a multiple of 20 are held out; the sidecar records the held-out accuracy and
AUC, and the build fails when the model cannot tell the held-out turns apart
(`MIN_AUC`): a broken feature or data path, not the model's ceiling.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from avatar.turn_words import BUCKETS, FEATURES, features, words
from export.common import (
    ArtifactRecipe,
    Tolerance,
    compare_outputs,
    ensure,
    worst,
)
from export.packages import package_file
from export.sidecar import Sidecar, sha256_file

log = logging.getLogger(__name__)

INPUT, OUTPUT = "features", "probability"
CHITCHAT = ("chitchat-dataset", "0.9.0", "chitchat_dataset/dataset.json")
CHATTERBOT = ("chatterbot-corpus", "1.3.3", "chatterbot_corpus/data/english")
HELD_OUT_EVERY = 20  # conversation i is held out when i % 20 == 0
CUTS_PER_LINE = 1  # an unfinished example per line (where it has a word to cut at)
EPOCHS, BATCH, LEARNING_RATE = 2, 2048, 0.01  # more fits the training turns, not the held-out
SEED = 0
MIN_AUC = 0.85  # held-out: finished turns ranked above cut ones
TOLERANCE = {OUTPUT: Tolerance(atol=1e-5)}  # ONNX against the trained torch model
_ENDS = (".", "?", "!", "…")


def _data(package: tuple[str, str, str]) -> Path:
    return package_file(*package)[0]


def conversations() -> Iterator[list[list[str]]]:
    """Every conversation as messages, each message its lines, in a fixed order."""
    import yaml

    data = json.loads(_data(CHITCHAT).read_text())
    for key in sorted(data):
        yield [[line["text"] for line in message] for message in data[key]["messages"]]
    for path in sorted(_data(CHATTERBOT).glob("*.yml")):
        for dialog in yaml.safe_load(path.read_text()).get("conversations") or []:
            yield [[str(line)] for line in dialog]


def examples(message: list[str], rng: random.Random) -> Iterator[tuple[str, bool]]:
    """(text, finished) pairs from one message: finished at the end of each line, cut
    inside a line at a word that no sentence mark ends."""
    said: list[str] = []
    for line in message:
        tokens = line.split()
        if not tokens:
            continue
        cuts = [k for k in range(1, len(tokens)) if not tokens[k - 1].endswith(_ENDS)]
        for k in rng.sample(cuts, min(CUTS_PER_LINE, len(cuts))):
            yield " ".join([*said, *tokens[:k]]), False
        said += tokens
        yield " ".join(said), True


def dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features [n, FEATURES] int64, finished [n] float32, held out [n] bool)."""
    rng = random.Random(SEED)
    rows, labels, held = [], [], []
    for index, conversation in enumerate(conversations()):
        out = index % HELD_OUT_EVERY == 0
        for message in conversation:
            for text, finished in examples(message, rng):
                row = features(text)
                if row is not None:
                    rows.append(row)
                    labels.append(finished)
                    held.append(out)
    return np.stack(rows), np.asarray(labels, np.float32), np.asarray(held)


def train(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """(weights [BUCKETS], bias): logistic regression by Adam on the hashed features."""
    import torch

    torch.manual_seed(SEED)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same weights on every machine
    try:
        weights = torch.nn.EmbeddingBag(BUCKETS, 1, mode="sum")
        torch.nn.init.zeros_(weights.weight)
        bias = torch.zeros(1, requires_grad=True)
        optimizer = torch.optim.Adam([weights.weight, bias], lr=LEARNING_RATE)
        inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
        order = torch.Generator().manual_seed(SEED)
        for epoch in range(EPOCHS):
            total = 0.0
            for batch in torch.randperm(len(x), generator=order).split(BATCH):
                logits = weights(inputs[batch]).squeeze(1) + bias
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(batch)
            log.info("turn_words: epoch %d, loss %.4f", epoch + 1, total / len(x))
    finally:
        torch.set_num_threads(threads)
    return weights.weight.detach().numpy().reshape(-1).copy(), float(bias.detach())


def predict(weights: np.ndarray, bias: float, x: np.ndarray) -> np.ndarray:
    """[n, 1] float32: the model in numpy (the reference the ONNX graph is checked on)."""
    logits = weights[x].sum(axis=1, dtype=np.float64) + bias
    return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)[:, None]


def graph(weights: np.ndarray, bias: float):  # -> onnx.ModelProto
    """features [batch, FEATURES] int64 -> probability [batch, 1] float32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Gather", ["weights", INPUT], ["picked"]),
        helper.make_node("ReduceSum", ["picked", "axis"], ["summed"], keepdims=1),
        helper.make_node("Add", ["summed", "bias"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT]),
    ]
    initializers = [
        numpy_helper.from_array(weights.astype(np.float32), "weights"),
        numpy_helper.from_array(np.array([1], np.int64), "axis"),
        numpy_helper.from_array(np.array([bias], np.float32), "bias"),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "turn_words",
            [helper.make_tensor_value_info(INPUT, TensorProto.INT64, ["batch", FEATURES])],
            [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 1])],
            initializers,
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="triton-avatar export.turn_words",
    )
    model.ir_version = 8  # what onnxruntime 1.31 and Triton 2.51's ORT read
    onnx.checker.check_model(model)
    return model


def figures(probs: np.ndarray, finished: np.ndarray) -> dict[str, float]:
    """Accuracy at 0.5 and AUC (the chance that a finished turn scores above a cut one)."""
    p, truth = probs.reshape(-1), finished.astype(bool)
    ranks = np.empty(len(p))
    ranks[np.argsort(p, kind="stable")] = np.arange(1, len(p) + 1)
    positives, negatives = int(truth.sum()), int((~truth).sum())
    auc = (ranks[truth].sum() - positives * (positives + 1) / 2) / (positives * negatives)
    return {
        "examples": len(p),
        "finished": positives,
        "accuracy": round(float(((p >= 0.5) == truth).mean()), 4),
        "auc": round(float(auc), 4),
        "p_finished_median": round(float(np.median(p[truth])), 3),
        "p_cut_median": round(float(np.median(p[~truth])), 3),
    }


class TurnWordsRecipe(ArtifactRecipe):
    name = "turn_words"

    def __init__(self) -> None:
        import avatar.turn_words

        self.code_files = (Path(avatar.turn_words.__file__),)  # the features are the model

    def key_inputs(self) -> dict[str, str]:
        return {
            "chitchat": sha256_file(_data(CHITCHAT)),
            "chatterbot": ",".join(sha256_file(p) for p in sorted(_data(CHATTERBOT).glob("*.yml"))),
        }

    def build(self, out_dir: Path) -> Sidecar:
        import onnx

        from export.common import onnx_session

        x, y, held = dataset()
        log.info("turn_words: %d examples (%d held out)", len(y), int(held.sum()))
        weights, bias = train(x[~held], y[~held])
        path = out_dir / "model.onnx"
        onnx.save(graph(weights, bias), str(path))
        reference = predict(weights, bias, x[held])
        served = onnx_session(path).run([OUTPUT], {INPUT: x[held]})[0]
        comparisons = compare_outputs(
            {OUTPUT: reference}, {OUTPUT: served}, TOLERANCE, context="held-out turns"
        )
        held_out = figures(served, y[held])
        log.info("turn_words on held-out conversations: %s", held_out)
        if held_out["auc"] < MIN_AUC:
            raise ValueError(
                f"turn_words on held-out conversations: {held_out}; expected AUC >= {MIN_AUC}: "
                "the features or the data are wrong"
            )
        return self.sidecar(
            path,
            source={
                f"{CHITCHAT[0]}=={CHITCHAT[1]}:{CHITCHAT[2]}": self.key_inputs()["chitchat"],
                f"{CHATTERBOT[0]}=={CHATTERBOT[1]}:{CHATTERBOT[2]}/*.yml": "see key",
            },
            validation={
                "licence": "trained here; data: chitchat-dataset (MIT), chatterbot-corpus (BSD)",
                "reference": "the trained weights in numpy",
                "outputs": worst(comparisons),
                "task": {"set": "held-out conversations, finished vs cut", **held_out},
            },
            notes=[
                "input: avatar.turn_words.features (hashed features of the words, lower case, "
                "no punctuation)",
                f"logistic regression, {EPOCHS} epochs of Adam, seed {SEED}",
            ],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("text", nargs="*", help="score these texts with the built model")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = ensure(TurnWordsRecipe(), force=args.force)
    log.info("turn_words artifact: %s\n%s", folder, (folder / Sidecar.FILENAME).read_text())
    if args.text:
        from export.common import onnx_session

        session = onnx_session(folder / "model.onnx")
        for text in args.text:
            row = features(text)
            p = None if row is None else float(session.run([OUTPUT], {INPUT: row[None]})[0])
            log.info("%-50r %s (%s)", text, "-" if p is None else f"{p:.3f}", " ".join(words(text)))
