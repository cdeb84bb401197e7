"""Verification of an exported decoder against PyTorch.

- logits and presents within tolerance on inputs other than the trace inputs (a left-padded
  batch with a nonzero past, and a first step with an empty past);
- greedy tokens of ONNX Runtime equal to those of PyTorch for many chat prompts, at batch 1
  and in a left-padded mixed-length batch (the agreement measured by evals.llm_decoding).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from avatar.llm.decoder import Decoder, KvLayout, Past, positions
from evals.llm_decoding import Agreement, greedy_rows
from export.common import Tolerance, ValidationError, compare_outputs

log = logging.getLogger(__name__)

LOGIT_TOLERANCE = Tolerance(atol=2e-3, rtol=1e-3)  # fp32 ORT vs eager PyTorch, 30 layers
KV_TOLERANCE = Tolerance(atol=1e-3, rtol=1e-3)


class TokenMismatchError(ValidationError):
    """Greedy tokens of the exported decoder differ from the reference's."""


class TorchDecoder(Decoder):
    """The PyTorch model as a reference `Decoder` (HF's own 2-D mask handling)."""

    def __init__(self, model: Any, layout: KvLayout):
        self.model, self.layout = model, layout

    def step(self, input_ids, attention_mask, position_ids, past):
        import torch
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        for i in range(self.layout.layers):
            if past[2 * i].shape[2]:
                cache.update(torch.from_numpy(past[2 * i]), torch.from_numpy(past[2 * i + 1]), i)
        with torch.no_grad():
            out = self.model(
                input_ids=torch.from_numpy(input_ids),
                attention_mask=torch.from_numpy(attention_mask),
                position_ids=torch.from_numpy(position_ids),
                past_key_values=cache,
                use_cache=True,
            )
        presents: Past = []
        for layer in out.past_key_values.layers:
            presents.extend((layer.keys.numpy(), layer.values.numpy()))
        return out.logits.numpy(), presents


def compare_step(reference: Decoder, candidate: Decoder, vocab: int, seed: int = 1) -> dict:
    """Logits/presents of one step on random left-padded inputs (batch 3, past 5, 4 new
    tokens) and on a first step with an empty past (batch 2). Raises ToleranceError."""
    rng = np.random.default_rng(seed)
    layout, results = reference.layout, []
    for batch, past_len, new in ((3, 5, 4), (2, 0, 6)):
        mask = np.ones((batch, past_len + new), np.int64)
        mask[0, : min(2, past_len + new - 1)] = 0
        ids = rng.integers(0, vocab, (batch, new), dtype=np.int64)
        shape = (batch, layout.kv_heads, past_len, layout.head_dim)
        past = [rng.standard_normal(shape).astype(np.float32) for _ in range(2 * layout.layers)]
        args = (ids, mask, positions(mask, new), past)
        (ref_logits, ref_kv), (got_logits, got_kv) = reference.step(*args), candidate.step(*args)
        real = mask[:, -new:].astype(bool)  # padded query rows are don't-care
        context = f"batch {batch}, past {past_len}, new {new}"
        results += compare_outputs(
            {"logits": ref_logits[real]},
            {"logits": got_logits[real]},
            {"logits": LOGIT_TOLERANCE},
            context,
        )
        names = layout.present_names()
        keep = mask.astype(bool)  # padded positions' KV is never attended to: don't-care
        results += compare_outputs(
            _real_positions(names, ref_kv, keep),
            _real_positions(names, got_kv, keep),
            dict.fromkeys(names, KV_TOLERANCE),
            context,
        )
    worst_logits = max(r.max_abs for r in results if r.name == "logits")
    worst_kv = max(r.max_abs for r in results if r.name != "logits")
    return {
        "logits_max_abs": worst_logits,
        "present_max_abs": worst_kv,
        "logits_tolerance": dataclasses.asdict(LOGIT_TOLERANCE),
    }


def _real_positions(names: list[str], kv: Past, keep: np.ndarray) -> dict[str, np.ndarray]:
    """Each present [B, H, T, D] at its unpadded positions only: [real positions, H, D]."""
    return {n: p.transpose(0, 2, 1, 3)[keep] for n, p in zip(names, kv, strict=True)}


def check_tokens(
    reference: Decoder,
    candidate: Decoder,
    prompts: list[list[int]],
    new: int,
    pad: int,
    *,
    batch: int = 5,
    gate: bool = True,
) -> dict:
    """Greedy agreement at batch 1 and left-padded batch; raise if `gate` and not equal."""
    record = {}
    for label, size in (("batch1", 1), (f"batch{batch}_left_padded", batch)):
        started = time.monotonic()
        ref = greedy_rows(reference, prompts, new, size, pad)
        got = greedy_rows(candidate, prompts, new, size, pad)
        agreement = Agreement.of(ref, got)
        record[label] = dataclasses.asdict(agreement)
        log.info("%s: %s (%.0f s)", label, agreement, time.monotonic() - started)
        if gate and not agreement.all_equal:
            bad = [i for i, (r, g) in enumerate(zip(ref, got, strict=True)) if r != g]
            raise TokenMismatchError(
                f"greedy tokens differ from PyTorch ({label}) for prompts {bad}: {agreement}"
            )
    return record
