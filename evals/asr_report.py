"""Measured figures of the ASR export (`python -m export.asr --report`), printed, not asserted.
The export passes its artifact folders and the packaged Whisper's CTranslate2 folder.

- transcripts through ONNX Runtime vs faster-whisper (same weights, float32, greedy,
  temperature 0, no conditioning on previous text) on the Piper clips and one > 30-s clip;
- encoder ms per window length, decoder ms per token (1 thread);
- short encoder windows (padding short audio to a multiple of n frames, not 3000);
- the INT8 and FP16 variants: identical transcripts, word error rate, speed;
- lockstep batching: 8 utterances decoded together vs one after another.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from avatar.asr.greedy import WhisperRuntime
from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
from avatar.asr.transcribe import AsrOptions, transcribe
from avatar.asr.vocab import WhisperVocab
from evals.clips import clips, long_clip
from evals.reference_asr import reference_transcripts
from evals.wer import wer

log = logging.getLogger(__name__)


def _ms(fn, repeat: int = 3) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1000


def encoder_ms(runtime: WhisperRuntime, frames: int, batch: int = 1) -> float:
    mel = np.random.default_rng(0).uniform(-1, 1, (batch, 80, frames)).astype(np.float32)
    return _ms(lambda: runtime.encode(mel))


def decoder_ms_per_token(runtime: WhisperRuntime, batch: int = 1, past: int = 20) -> float:
    cross = runtime.encode(np.zeros((batch, 80, 3000), np.float32))
    kv = np.zeros((batch, cross.shape[1], cross.shape[2], past, cross.shape[4]), np.float32)
    tokens = np.full((batch, 1), 440, np.int64)
    return _ms(lambda: runtime.decode(tokens, kv, cross), repeat=10)


def _compare(name: str, got: list[str], refs: list[str], texts: list[str]) -> None:
    same = sum(g == r for g, r in zip(got, refs, strict=True))
    wer_text = np.mean([wer(t, g) for t, g in zip(texts, got, strict=True)])
    wer_ref = np.mean([wer(r, g) for r, g in zip(refs, got, strict=True)])
    print(f"{name:34s} identical to faster-whisper {same}/{len(refs)}   "
          f"WER vs text {wer_text:.3f}   WER vs faster-whisper {wer_ref:.3f}")  # fmt: skip
    for g, r in zip(got, refs, strict=True):
        if g != r:
            print(f"    differs: {g!r}\n         ref {r!r}")


def report(
    encoder_dir: Path, decoder_dir: Path, ct2: Path, cache_root: Path, count: int | None = None
) -> None:
    """Print the figures of the exported encoder and decoder folders, with the reference
    transcripts of the CTranslate2 Whisper `ct2` (the same weights), cached in `cache_root`."""
    vocab = WhisperVocab.load(ct2 / "tokenizer.json", ct2 / "config.json")
    items = clips(count)
    items.append(long_clip(clips()[:12]))
    print(f"clips: {len(items)} ({sum(c.seconds for c in items):.0f} s, the last one "
          f"{items[-1].seconds:.1f} s long)")  # fmt: skip
    refs = reference_transcripts(items, ct2, cache_root)
    texts = [c.text for c in items]
    audios = [c.audio for c in items]

    fp32 = OnnxWhisperRuntime(encoder_dir / "model.onnx", decoder_dir / DECODER_STEP_FILE)
    started = time.perf_counter()
    got = [transcribe(fp32, vocab, [a])[0].text for a in audios]
    print(f"ONNX Runtime fp32, one at a time: {time.perf_counter() - started:.1f} s")
    _compare("fp32, 3000-frame windows", got, refs, texts)
    for step in (1000, 500):
        options = AsrOptions(window_step=step)
        short = [transcribe(fp32, vocab, [a], options)[0].text for a in audios]
        _compare(f"fp32, windows padded to {step}*k", short, refs, texts)

    print("\nencoder ms (1 thread, batch 1):")
    for frames in (3000, 1000, 500, 300):
        print(
            f"  {frames:5d} frames ({frames / 100:4.1f} s window): {encoder_ms(fp32, frames):7.1f}"
        )
    for batch in (1, 8):
        print(f"decoder ms per token, batch {batch}, 20 past tokens: "
              f"{decoder_ms_per_token(fp32, batch):.1f}")  # fmt: skip

    started = time.perf_counter()
    transcribe(fp32, vocab, audios[:8])
    batched = time.perf_counter() - started
    started = time.perf_counter()
    for a in audios[:8]:
        transcribe(fp32, vocab, [a])
    single = time.perf_counter() - started
    print(f"8 clips: lockstep batch {batched:.1f} s, one after another {single:.1f} s")

    files = {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}
    for enc, dec in (("int8", "int8"), ("fp16", "fp16"), ("int8", "fp32"), ("fp32", "int8")):
        decoder = DECODER_STEP_FILE if dec == "fp32" else files[dec]
        runtime = OnnxWhisperRuntime(encoder_dir / files[enc], decoder_dir / decoder)
        got = [transcribe(runtime, vocab, [a])[0].text for a in audios]
        print()
        _compare(f"encoder {enc}, decoder {dec}", got, refs, texts)
        print(f"  encoder ms 3000 frames: {encoder_ms(runtime, 3000):.1f}; decoder ms/token: "
              f"{decoder_ms_per_token(runtime):.1f}")  # fmt: skip
