"""PyTorch causal LM -> ONNX decoder step with an explicit KV cache.

Tensors (B batch, S new tokens, P past length, T = P + S, H kv heads, D head dim, V vocab):

    input_ids        int64   [B, S]
    attention_mask   int64   [B, T]      1 = real token, 0 = (left) padding
    position_ids     int64   [B, S]
    past_key_values.{i}.key / .value   float32 [B, H, P, D]   P may be 0 (first step)
    -> logits        float32 [B, S, V]
    -> present.{i}.key / .value        float32 [B, H, T, D]

The batch is axis 0 of every tensor, so Triton's dynamic batcher can concatenate requests
with equal S and P. The causal + padding mask is built inside the graph from the 2-D
attention mask (eager attention, additive mask), so any left-padded batch works.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from pathlib import Path
from typing import Any

from avatar.llm.decoder import KvLayout
from export.common import torch_to_onnx

log = logging.getLogger(__name__)

OPSET = 17
MASKED = -1.0e4  # additive attention mask value of hidden positions


@dataclasses.dataclass(frozen=True)
class DecoderDims:
    """The shape facts of a decoder that the KV cache tensors depend on."""

    layers: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> DecoderDims:
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        return cls(
            config.num_hidden_layers,
            config.num_key_value_heads,
            head_dim,
            config.vocab_size,
        )

    @property
    def layout(self) -> KvLayout:
        return KvLayout(self.layers, self.kv_heads, self.head_dim)


INPUT_NAMES = ["input_ids", "attention_mask", "position_ids"]


def _decoder_step_module(model: Any):
    """Wrap `model` as forward(input_ids, attention_mask, position_ids, *past) -> flat tuple."""
    import torch
    from transformers.cache_utils import DynamicCache

    class DecoderStep(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, *past):
            kv_len = attention_mask.shape[1]
            q_len = input_ids.shape[1]
            key_pos = torch.arange(kv_len, device=input_ids.device)
            query_pos = torch.arange(q_len, device=input_ids.device) + (kv_len - q_len)
            causal = key_pos[None, :] <= query_pos[:, None]  # [S, T]
            allowed = causal[None, None, :, :] & attention_mask[:, None, None, :].bool()
            zero = torch.zeros((), dtype=torch.float32)
            # -1e4, not finfo.min: finite in FP16 too (TensorRT engines), so a fully masked
            # (padded) query row averages instead of producing NaN that would leak into the
            # KV cache; in FP32 exp(-1e4) is exactly 0, so results are unchanged.
            neg = torch.tensor(MASKED, dtype=torch.float32)
            mask4d = torch.where(allowed, zero, neg)  # [B, 1, S, T] additive
            cache = DynamicCache()
            for i in range(len(past) // 2):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.inner(
                input_ids=input_ids,
                attention_mask=mask4d,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                return_dict=True,
            )
            presents = []
            layers = out.past_key_values.layers
            for layer in layers:
                presents.extend((layer.keys, layer.values))
            return (out.logits, *presents)

    return DecoderStep(model).eval()


def _example_inputs(dims: DecoderDims, batch: int = 2, seq: int = 3, past: int = 4):
    """Trace inputs with nonzero past (dynamic axes make past=0 work at run time)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, dims.vocab, (batch, seq), generator=gen)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    mask[0, :2] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -seq:]
    kv = [
        torch.randn(batch, dims.kv_heads, past, dims.head_dim, generator=gen)
        for _ in range(2 * dims.layers)
    ]
    return (ids, mask, pos, *kv)


def export_decoder(model: Any, path: Path, opset: int = OPSET) -> DecoderDims:
    """Export one decoder step of `model` to `path` (single file, weights inside)."""
    import torch

    dims = DecoderDims.of(model.config)
    module = _decoder_step_module(model)
    past_names, present_names = dims.layout.past_names(), dims.layout.present_names()
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    axes.update({n: {0: "batch", 2: "past_sequence"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in present_names})
    log.info("exporting %d-layer decoder to %s (opset %d)", dims.layers, path, opset)
    # TracerWarnings: the DynamicCache's lazy-init branch is traced once (an empty tensor
    # concatenated with the past), which is right for every past length, 0 included.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch_to_onnx(
            module,
            _example_inputs(dims),
            Path(path),
            inputs=INPUT_NAMES + past_names,
            outputs=["logits", *present_names],
            opset=opset,
            dynamic_axes=axes,
        )
    return dims
