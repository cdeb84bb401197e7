"""The served networks in PyTorch, built from transformers' configs (configs.json, checked
against the packaged models) and the project's export modules, with their example inputs
and Triton tensors: one `Stage` per served model of the turn's critical path.

The shapes of a turn (the served ones): a question of ~4 s in a 10-s ASR window, a 24-token
transcript, a 320-token prompt (persona + knowledge + history), a first clause of 12
tokens, a 24-token sentence for emotion, 60 phonemes of TTS, 1.5 s of lipsync audio.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from avatar.model_io import (
    ASR_DECODER,
    ASR_ENCODER,
    EMOTION_ENCODER,
    LIPSYNC,
    LLM_DECODER,
    TTS_VITS,
    TURN_DETECTOR,
)

CONFIGS: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).with_name("configs.json")).read_text()
)
ASR_FRAMES = 1000
TURN_FRAMES = 800
TRANSCRIPT_TOKENS = 24
PROMPT_TOKENS = 320
CLAUSE_TOKENS = 12
EMOTION_TOKENS = 24
PHONEMES = 60
LIPSYNC_SAMPLES = 24_000
PHONEMES_PER_S = 14.0


def config(name: str) -> dict[str, Any]:
    """configs.json's entry `name`, the keywords of its transformers config."""
    return {k: v for k, v in CONFIGS[name].items() if k != "source"}


@dataclasses.dataclass(frozen=True)
class TensorDef:
    name: str
    dtype: str  # "fp16" | "int64" | "fp32"
    dims: tuple[int, ...]  # without the batch axis; -1 = variable


@dataclasses.dataclass
class Stage:
    """One network: how to build it, an example request, its Triton tensors."""

    name: str
    build: Callable[[Any, Any], Callable[..., tuple]]  # (torch, device) -> forward
    example: Callable[[Any, Any, int], dict[str, Any]]  # (torch, device, batch) -> inputs
    inputs: tuple[TensorDef, ...]
    outputs: tuple[TensorDef, ...]


def _float(torch, device):
    """The networks' float type: FP16 on a GPU (as the TensorRT engines run), FP32 else."""
    return torch.float16 if device.type == "cuda" else torch.float32


def _half(torch, module, device):
    return module.to(device=device, dtype=_float(torch, device)).eval()


def _whisper(name: str):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    return WhisperForConditionalGeneration(WhisperConfig(**config(name))).eval()


def _asr_encoder(torch, device):
    from export.asr.modules import WhisperEncoderExport

    net = _half(torch, WhisperEncoderExport(_whisper("whisper_base")), device)
    return lambda mel: net(mel)[1:]


def _asr_decoder(torch, device):
    from export.asr.modules import WhisperDecoderExport

    return _half(torch, WhisperDecoderExport(_whisper("whisper_base")), device)


def _turn_detector(torch, device):
    # Smart Turn: a Whisper-tiny encoder over 8 s, its states pooled, one logit, a sigmoid
    whisper = _whisper("smart_turn")
    encoder = _half(torch, whisper.model.encoder, device)
    head = _half(torch, torch.nn.Linear(whisper.config.d_model, 1), device)

    def forward(mel):
        hidden = encoder(mel).last_hidden_state
        return (torch.sigmoid(head(hidden.mean(dim=1))),)

    return forward


def _llm_decoder(torch, device):
    """SmolLM2's decoder step (transformers' LlamaForCausalLM) with the KV cache as one
    tensor [B, 2 x layers, kv heads, past, Dh] in and out, as a stage model carries it."""
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    settings = LlamaConfig(**config("smollm2"))
    net = _half(torch, LlamaForCausalLM(settings), device)
    layers = settings.num_hidden_layers

    def forward(input_ids, past):
        cache = DynamicCache()
        for i in range(layers):
            cache.update(past[:, 2 * i], past[:, 2 * i + 1], i)
        start = past.shape[3]
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        out = net(
            input_ids=input_ids,
            past_key_values=cache,
            position_ids=positions[None].expand(input_ids.shape[0], -1),
            use_cache=True,
            logits_to_keep=1,
        )
        present = [t for i in range(layers) for t in _layer_kv(out.past_key_values, i)]
        return out.logits[:, -1], torch.stack(present, dim=1)

    return forward


def _layer_kv(cache, index: int) -> tuple[Any, Any]:
    """(keys, values) of a DynamicCache's layer (transformers >= 4.56 keeps `layers`)."""
    if hasattr(cache, "layers"):
        return cache.layers[index].keys, cache.layers[index].values
    return cache.key_cache[index], cache.value_cache[index]


def _emotion_encoder(torch, device):
    from transformers import BertConfig, BertModel

    net = _half(torch, BertModel(BertConfig(**config("minilm"))), device)

    def forward(input_ids):
        states = net(input_ids=input_ids).last_hidden_state
        return (torch.nn.functional.normalize(states.mean(dim=1), dim=1),)

    return forward


def _tts_vits(torch, device):
    from transformers import VitsConfig, VitsModel

    settings = VitsConfig(**config("piper_medium"))
    # FP32: the duration flow's spline (a quadratic root) leaves FP16's range.
    net = VitsModel(settings).to(device).eval()
    # Random weights predict random durations: scale them so that the example's phonemes
    # last what the packaged voice says them in (~14 phonemes/s), as the real model would.
    with torch.inference_mode():
        phonemes = ids(torch, device, 1, PHONEMES, settings.vocab_size)
        for _ in range(3):  # durations are rounded up per phoneme: not quite proportional
            seconds = net(input_ids=phonemes).waveform.shape[-1] / settings.sampling_rate
            net.speaking_rate *= seconds / (PHONEMES / PHONEMES_PER_S)

    def forward(phonemes):
        return (net(input_ids=phonemes).waveform,)

    return forward


def _lipsync(torch, device):
    from networks.lipsync import load_model

    net = load_model().to(device).eval()  # FP32: its log-mel front end wants the range
    return lambda audio: net(audio.float())


def mel(torch, device, batch, frames):
    return torch.randn(batch, 80, frames, device=device, dtype=_float(torch, device))


def ids(torch, device, batch, n, vocab):
    return torch.randint(0, vocab, (batch, n), device=device, dtype=torch.int64)


def kv(torch, device, shape: tuple[int, ...]):
    """A KV cache [B, 2L, heads, past, Dh] of small random values."""
    return torch.randn(*shape, device=device, dtype=_float(torch, device)) * 0.1


def _dims(io, kind: str, name: str) -> tuple[int, ...]:
    """A served tensor's dims (avatar.model_io): the stage model keeps the served shape."""
    values = io.inputs if kind == "input" else io.outputs
    return values[name].spec.dims


FP, I64 = "fp16", "int64"
WHISPER = config("whisper_base")
ASR_KV = _dims(ASR_ENCODER, "output", "cross_kv")  # [2 x layers, heads, T, Dh]
LLM = config("smollm2")
LLM_KV = (2 * LLM["num_hidden_layers"], LLM["num_key_value_heads"], -1, LLM["head_dim"])
VOCAB_LLM = _dims(LLM_DECODER, "output", "logits")[-1]
VOCAB_ASR = _dims(ASR_DECODER, "output", "logits")[-1]


def _asr_kv(batch_shape: tuple[int, ...], frames: int) -> tuple[int, ...]:
    return (*batch_shape, ASR_KV[0], ASR_KV[1], frames, ASR_KV[3])


STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            TURN_DETECTOR.model,
            _turn_detector,
            lambda t, d, b: {"mel": mel(t, d, b, TURN_FRAMES)},
            (TensorDef("mel", FP, _dims(TURN_DETECTOR, "input", "input_features")),),
            (TensorDef("probability", FP, _dims(TURN_DETECTOR, "output", "probability")),),
        ),
        Stage(
            ASR_ENCODER.model,
            _asr_encoder,
            lambda t, d, b: {"mel": mel(t, d, b, ASR_FRAMES)},
            (TensorDef("mel", FP, _dims(ASR_ENCODER, "input", "mel")),),
            (TensorDef("cross_kv", FP, ASR_KV),),
        ),
        Stage(  # the stage model carries the caches the served one keeps as implicit state
            ASR_DECODER.model,
            _asr_decoder,
            lambda t, d, b: {
                "tokens": ids(t, d, b, 1, VOCAB_ASR),
                "self_kv": kv(t, d, _asr_kv((b,), 12)),
                "cross_kv": kv(t, d, _asr_kv((b,), ASR_FRAMES // 2)),
            },
            (
                TensorDef("tokens", I64, _dims(ASR_DECODER, "input", "tokens")),
                TensorDef("self_kv", FP, ASR_KV),
                TensorDef("cross_kv", FP, ASR_KV),
            ),
            (TensorDef("logits", FP, (VOCAB_ASR,)), TensorDef("self_kv_out", FP, ASR_KV)),
        ),
        Stage(
            LLM_DECODER.model,
            _llm_decoder,
            lambda t, d, b: {
                "input_ids": ids(t, d, b, 1, VOCAB_LLM),
                "past": kv(t, d, (b, *LLM_KV[:2], PROMPT_TOKENS, LLM_KV[3])),
            },
            (
                TensorDef("input_ids", I64, _dims(LLM_DECODER, "input", "input_ids")),
                TensorDef("past", FP, LLM_KV),
            ),
            (TensorDef("logits", FP, (VOCAB_LLM,)), TensorDef("present", FP, LLM_KV)),
        ),
        Stage(
            EMOTION_ENCODER.model,
            _emotion_encoder,
            lambda t, d, b: {
                "input_ids": ids(t, d, b, EMOTION_TOKENS, config("minilm")["vocab_size"])
            },
            (TensorDef("input_ids", I64, _dims(EMOTION_ENCODER, "input", "input_ids")),),
            (TensorDef("embedding", FP, _dims(EMOTION_ENCODER, "output", "embedding")),),
        ),
        Stage(  # VITS on phoneme ids alone (transformers' VitsModel draws its own noise)
            TTS_VITS.model,
            _tts_vits,
            lambda t, d, b: {
                "phonemes": ids(t, d, b, PHONEMES, config("piper_medium")["vocab_size"])
            },
            (TensorDef("phonemes", I64, _dims(TTS_VITS, "input", "phoneme_ids")),),
            (TensorDef("audio", "fp32", _dims(TTS_VITS, "output", "audio")),),
        ),
        Stage(
            LIPSYNC.model,
            _lipsync,
            lambda t, d, b: {"audio": t.randn(b, LIPSYNC_SAMPLES, device=d) * 0.1},
            (TensorDef("audio", "fp32", (LIPSYNC_SAMPLES,)),),
            tuple(
                TensorDef(name, "fp32", value.spec.dims) for name, value in LIPSYNC.outputs.items()
            ),
        ),
    )
}
