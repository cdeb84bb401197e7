"""The abstract decoder step the generation code runs on, its ONNX Runtime implementation,
and KV-cache batching helpers.

Shapes (B batch, S new tokens, P past length, T = P + S, H kv heads, D head dim, V vocab):
a decoder step takes input_ids [B, S] int64, attention_mask [B, T] int64 (0 = left pad),
position_ids [B, S] int64 and a past of 2 * layers float32 arrays [B, H, P, D] (key, value
per layer, in layer order), and returns logits [B, S, V] and presents [B, H, T, D].
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

Past = list[np.ndarray]  # 2 * layers arrays [B, H, P, D]: layer 0 key, layer 0 value, ...


@dataclasses.dataclass(frozen=True)
class KvLayout:
    """What the KV cache of a decoder looks like, and its tensor names in the ONNX graph."""

    layers: int
    kv_heads: int
    head_dim: int

    def past_names(self) -> list[str]:
        return [f"past_key_values.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")]

    def present_names(self) -> list[str]:
        return [f"present.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")]

    def empty(self, batch: int = 1) -> Past:
        """A past of length 0: [batch, H, 0, D] per tensor (the first step)."""
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return [np.zeros(shape, np.float32) for _ in range(2 * self.layers)]


class Decoder(abc.ABC):
    """One forward step of a causal LM with an explicit KV cache."""

    layout: KvLayout

    @abc.abstractmethod
    def step(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: Past,
    ) -> tuple[np.ndarray, Past]:
        """(logits [B, S, V], presents [B, H, T, D] each)."""


class OrtDecoder(Decoder):
    """The exported decoder run in-process by ONNX Runtime."""

    def __init__(self, path: Path, threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        _, heads, _, head_dim = past[0].shape
        self.layout = KvLayout(len(past) // 2, int(heads), int(head_dim))
        self._past_names = self.layout.past_names()
        self._outputs = ["logits", *self.layout.present_names()]

    def step(self, input_ids, attention_mask, position_ids, past):
        feed = {
            "input_ids": np.ascontiguousarray(input_ids, np.int64),
            "attention_mask": np.ascontiguousarray(attention_mask, np.int64),
            "position_ids": np.ascontiguousarray(position_ids, np.int64),
        }
        feed.update(zip(self._past_names, past, strict=True))
        logits, *presents = self.session.run(self._outputs, feed)
        return logits, presents


# ----------------------------------------------------------------------- batching helpers


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token rows -> (input_ids [B, S], attention_mask [B, S]) left-padded to the longest."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = row
            mask[i, width - len(row) :] = 1
    return ids, mask


def positions(mask: np.ndarray, new: int) -> np.ndarray:
    """Position ids [B, new] of the last `new` columns of a left-padded mask [B, T]."""
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return pos[:, mask.shape[1] - new :].astype(np.int64)


def stack_pasts(pasts: Sequence[Past], lengths: Sequence[int]) -> tuple[Past, np.ndarray]:
    """Batch single-row pasts of different lengths by left padding on the time axis.

    pasts[i]: 2L arrays [1, H, P_i, D]; returns 2L arrays [B, H, max P, D] and the past
    part of the attention mask [B, max P] (0 where padded).
    """
    width = max(lengths)
    mask = np.zeros((len(pasts), width), np.int64)
    for i, length in enumerate(lengths):
        mask[i, width - length :] = 1
    if len(pasts) == 1:
        return list(pasts[0]), mask
    batched = []
    for t in range(len(pasts[0])):
        first = pasts[0][t]
        out = np.zeros((len(pasts), first.shape[1], width, first.shape[3]), np.float32)
        for i, (past, length) in enumerate(zip(pasts, lengths, strict=True)):
            if length:
                out[i, :, width - length :, :] = past[t][0, :, -length:, :]
        batched.append(out)
    return batched, mask


def unstack_presents(presents: Past, lengths: Sequence[int]) -> list[Past]:
    """Split batched presents [B, H, T, D] into per-row pasts [1, H, length_i, D] (the
    real, unpadded positions are the last length_i)."""
    total = presents[0].shape[2]
    return [
        [p[i : i + 1, :, total - length :, :] for p in presents] for i, length in enumerate(lengths)
    ]


def greedy(
    decoder: Decoder, prompts: Sequence[Sequence[int]], max_new: int, pad_id: int = 0
) -> list[list[int]]:
    """Greedy continuation of a left-padded batch of prompts: max_new tokens per row (no
    early stop, so rows stay aligned; for verification and measurements)."""
    ids, mask = left_pad(prompts, pad_id)
    past = decoder.layout.empty(len(prompts))
    step_ids, out = ids, [[] for _ in prompts]
    for _ in range(max_new):
        logits, past = decoder.step(step_ids, mask, positions(mask, step_ids.shape[1]), past)
        nxt = logits[:, -1, :].argmax(-1)
        for row, token in zip(out, nxt, strict=True):
            row.append(int(token))
        step_ids = nxt[:, None].astype(np.int64)
        mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
    return out
