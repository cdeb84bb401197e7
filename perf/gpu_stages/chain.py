"""The turn's critical path through the stage models: which served models it calls, read
from the repository's configs, and one turn of it through `call(model, inputs)`."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from avatar.model_io import LIPSYNC, TURN_DETECTOR
from perf.gpu_stages.networks import (
    ASR_FRAMES,
    CLAUSE_TOKENS,
    LIPSYNC_SAMPLES,
    LLM_KV,
    PROMPT_TOKENS,
    STAGES,
    TRANSCRIPT_TOKENS,
    VOCAB_ASR,
    VOCAB_LLM,
    ids,
    kv,
    mel,
)

# After the end of speech, before the first audio: the turn model, ASR, the prompt and the
# first clause of the LLM, the clause's emotion and its TTS (lipsync runs beside playback).
CRITICAL_PATH = (
    "turn_detector",
    "asr_encoder",
    "asr_decoder",
    "llm_prefill",
    "llm_clause",
    "emotion_encoder",
    "tts_vits",
)


def turn_models(source: Path | None = None) -> dict[str, str]:
    """Each stage's served model: the networks the `avatar` model's chain reaches, read
    from the repository's configs (model_configs.pbtxt.call_graph, as perf.latency reads
    it), and the gateway's end-of-turn and lipsync models (avatar.model_io)."""
    from model_configs.pbtxt import SOURCE_REPOSITORY, call_graph

    graph = call_graph(source or SOURCE_REPOSITORY, root="avatar")
    avatar = graph["avatar"]
    asr, llm, tts = (graph[avatar[key]] for key in ("asr_model", "llm_model", "tts_model"))
    return {
        "turn_detector": TURN_DETECTOR.model,
        "asr_encoder": asr["encoder_model"],
        "asr_decoder": asr["decoder_model"],
        "llm_decoder": llm["decoder_model"],
        "emotion_encoder": avatar["emotion_model"],
        "tts_vits": tts["vits_model"],
        "lipsync": LIPSYNC.model,
    }


def chain_once(
    torch,
    device,
    call: Callable[[str, dict[str, Any]], dict[str, Any]],
    models: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """The turn's critical path once, through `call(model, inputs) -> outputs`; ms per
    stage. `models`: each stage's model name (turn_models(); default: the stage's own).

    Every tensor handed on is the previous stage's output as it came back (on the GPU)."""
    models = models or {stage: stage for stage in STAGES}
    ms: dict[str, float] = {}

    def timed(label: str, stage: str, inputs: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        out = call(models[stage], inputs)
        ms[label] = ms.get(label, 0.0) + (time.perf_counter() - t0) * 1000
        return out

    def example(stage: str) -> dict[str, Any]:
        return STAGES[stage].example(torch, device, 1)

    timed("turn_detector", "turn_detector", example("turn_detector"))
    cross_kv = timed("asr_encoder", "asr_encoder", {"mel": mel(torch, device, 1, ASR_FRAMES)})
    tokens = ids(torch, device, 1, 4, VOCAB_ASR)  # Whisper's start tokens
    shape = cross_kv["cross_kv"].shape  # [1, 2 x layers, heads, T, Dh]
    self_kv = kv(torch, device, (1, shape[1], shape[2], 0, shape[4]))
    for _ in range(TRANSCRIPT_TOKENS):
        step = timed(
            "asr_decoder",
            "asr_decoder",
            {"tokens": tokens, "self_kv": self_kv, "cross_kv": cross_kv["cross_kv"]},
        )
        tokens = step["logits"].argmax(dim=-1, keepdim=True)
        self_kv = step["self_kv_out"]
    past = kv(torch, device, (1, LLM_KV[0], LLM_KV[1], 0, LLM_KV[3]))  # the prompt's prefill
    prompt = {"input_ids": ids(torch, device, 1, PROMPT_TOKENS, VOCAB_LLM), "past": past}
    out = timed("llm_prefill", "llm_decoder", prompt)
    for _ in range(CLAUSE_TOKENS):
        token = out["logits"].argmax(dim=-1, keepdim=True)
        out = timed("llm_clause", "llm_decoder", {"input_ids": token, "past": out["present"]})
    timed("emotion_encoder", "emotion_encoder", example("emotion_encoder"))
    wave = timed("tts_vits", "tts_vits", example("tts_vits"))["audio"]
    audio = wave[:, :LIPSYNC_SAMPLES].float().contiguous()
    if audio.shape[1] < LIPSYNC_SAMPLES:  # random weights say a random length: pad
        audio = torch.nn.functional.pad(audio, (0, LIPSYNC_SAMPLES - audio.shape[1]))
    timed("lipsync", "lipsync", {"audio": audio})
    return ms
