"""all-MiniLM-L6-v2 sentence embeddings in PyTorch: the reference the served
`emotion_encoder` ONNX graph is exported from and checked against, and the encoder the
emotion classifier is trained on (training/emotion/train.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from avatar.animation.emotion_classifier import MAX_TOKENS, model_dir


class SentenceEncoder:
    """Mean-pooled token states, L2-normalised: [N, 384] (sentence-transformers' recipe)."""

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
                out.append(pool(torch, states, batch["attention_mask"]).numpy())
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.dim))


def pool(torch, states, attention_mask):
    """Mean over the real tokens, then L2 normalisation: [N, T, D] -> [N, D]."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)
