"""Export-friendly torch views of a transformers Whisper: encoder with cross-attention K/V, and
one decoder step with a self-attention KV cache.

Both reuse the parameters of `WhisperForConditionalGeneration` (no copies) and write attention
out in plain tensor ops, so the classic ONNX exporter traces them without transformers' cache
objects. Shapes (B batch, T encoder positions, L decoder layers, H heads, Dh head size):

    encoder: mel [B, 80, 2T] -> hidden [B, T, D], cross_kv [B, 2L, H, T, Dh]
    decoder: tokens [B, n], self_kv [B, 2L, H, P, Dh], cross_kv [B, 2L, H, T, Dh]
             -> logits [B, vocab] (last position), self_kv_out [B, 2L, H, P + n, Dh]

K/V of layer i sit at index 2i (keys) and 2i + 1 (values) of the second axis. The encoder
accepts fewer than 3000 frames: it adds the first T positional embeddings (Whisper was trained
on full 30-s windows only; `export.asr.report` measures what a shorter window changes).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, D] -> [B, H, T, D/H]."""
    b, t, d = x.shape
    return x.reshape(b, t, heads, d // heads).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, Dh] -> [B, T, H*Dh]."""
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """q [B, H, n, Dh] (scaled), k/v [B, H, S, Dh], mask [n, S] additive -> [B, H, n, Dh]."""
    scores = q @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores + mask
    return torch.softmax(scores, dim=-1) @ v


class WhisperEncoderExport(nn.Module):
    """mel [B, n_mels, frames] -> (hidden [B, frames/2, D], cross_kv [B, 2L, H, frames/2, Dh])."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder = model.model.encoder
        self.decoder_layers = model.model.decoder.layers
        self.heads = model.config.encoder_attention_heads
        self.dec_heads = model.config.decoder_attention_heads

    def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.encoder
        x = F.gelu(enc.conv1(mel))
        x = F.gelu(enc.conv2(x)).transpose(1, 2)  # [B, T, D]
        x = x + enc.embed_positions.weight[: x.shape[1]]
        for layer in enc.layers:
            h = layer.self_attn_layer_norm(x)
            att = layer.self_attn
            q = _heads(att.q_proj(h) * att.scaling, self.heads)
            a = _attend(
                q, _heads(att.k_proj(h), self.heads), _heads(att.v_proj(h), self.heads), None
            )
            x = x + att.out_proj(_merge(a))
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(F.gelu(layer.fc1(h)))
        x = enc.layer_norm(x)
        kv = []
        for layer in self.decoder_layers:
            kv.append(_heads(layer.encoder_attn.k_proj(x), self.dec_heads))
            kv.append(_heads(layer.encoder_attn.v_proj(x), self.dec_heads))
        return x, torch.stack(kv, dim=1)


class WhisperDecoderExport(nn.Module):
    """One decoder call over n new tokens with a self-attention cache of P past tokens."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.decoder = model.model.decoder
        self.heads = model.config.decoder_attention_heads
        # [D, vocab]: the token embedding, transposed once, serves both the embedding lookup
        # (gather on axis 1) and the tied output projection, so the ONNX file holds one copy.
        weight = self.decoder.embed_tokens.weight.detach().T.contiguous()
        self.vocab_weight = nn.Parameter(weight, requires_grad=False)  # an initializer, once

    def forward(
        self, tokens: torch.Tensor, self_kv: torch.Tensor, cross_kv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dec = self.decoder
        past, n = self_kv.shape[3], tokens.shape[1]
        b = tokens.shape[0]
        embedded = torch.index_select(self.vocab_weight, 1, tokens.reshape(-1)).T
        x = embedded.reshape(b, n, -1) + dec.embed_positions.weight[past : past + n]
        query_pos = torch.arange(n, device=tokens.device)[:, None] + past
        key_pos = torch.arange(past + n, device=tokens.device)[None, :]
        mask = torch.where(key_pos > query_pos, float("-inf"), 0.0).to(x.dtype)  # [n, P+n]
        present = []
        for i, layer in enumerate(dec.layers):
            h = layer.self_attn_layer_norm(x)
            att = layer.self_attn
            q = _heads(att.q_proj(h) * att.scaling, self.heads)
            k = torch.cat([self_kv[:, 2 * i], _heads(att.k_proj(h), self.heads)], dim=2)
            v = torch.cat([self_kv[:, 2 * i + 1], _heads(att.v_proj(h), self.heads)], dim=2)
            present += [k, v]
            x = x + att.out_proj(_merge(_attend(q, k, v, mask)))
            h = layer.encoder_attn_layer_norm(x)
            att = layer.encoder_attn
            q = _heads(att.q_proj(h) * att.scaling, self.heads)
            a = _attend(q, cross_kv[:, 2 * i], cross_kv[:, 2 * i + 1], None)
            x = x + att.out_proj(_merge(a))
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(F.gelu(layer.fc1(h)))
        last = dec.layer_norm(x[:, -1])  # [B, D]
        logits = last @ self.vocab_weight  # the output projection is tied to the embedding
        return logits, torch.stack(present, dim=1)
