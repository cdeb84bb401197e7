"""Transcribing while the user speaks: word error rate and the time left at the end of speech.

`python -m perf asr-prefix` replays each clip (the real human recordings and the packaged
voice's questions) as a live caller sees it: every `--every` seconds of speech a pass over the
audio so far, each starting from what the two passes before it agreed on
(`avatar.asr.agreement`), then the pass over the whole utterance (the one the end of speech
waits for) from the last agreement. Against the same final pass without a prefix, in one run:
corpus WER (case, punctuation and digits vs words do not count), decoder steps and time of
the final pass (encoder included, ONNX Runtime in-process, 1 thread, batch 1), p50 / p95.
Written to build/perf/asr_prefix/prefix.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np

from avatar.asr.agreement import common_prefix, whole_words
from avatar.asr.features import SAMPLE_RATE
from avatar.asr.greedy import WhisperRuntime
from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
from avatar.asr.transcribe import AsrOptions, Transcript, transcribe
from avatar.asr.vocab import WhisperVocab
from evals.clips import Clip, clips
from evals.recordings import human_clips
from evals.report import DEFAULT_OUT, save_results, tables_per_set
from evals.wer import corpus_wer
from export.asr.weights import packaged_ct2_dir
from export.registry import ensure_all

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "asr_prefix"
SERVED = AsrOptions(window_step=100, window_margin=300)  # model_repository/asr/config.pbtxt
EVERY_S = (1.0, 0.5)


class CountingRuntime(WhisperRuntime):
    """The in-process runtime, counting decoder steps."""

    def __init__(self, runtime: OnnxWhisperRuntime):
        self.runtime, self.steps = runtime, 0

    def encode(self, mel):
        return self.runtime.encode(mel)

    def decode(self, tokens, self_kv, cross_kv):
        self.steps += 1
        return self.runtime.decode(tokens, self_kv, cross_kv)


def final_prefix(
    runtime: WhisperRuntime, vocab: WhisperVocab, audio: np.ndarray, every_s: float
) -> list[int]:
    """The prefix the pass at the end of speech starts from: passes every `every_s` seconds
    of the audio so far, each from the agreement of the two before it."""
    previous: list[int] | None = None
    prefix: list[int] = []
    for end in np.arange(every_s, len(audio) / SAMPLE_RATE, every_s):
        part = audio[: int(end * SAMPLE_RATE)]
        tokens = transcribe(runtime, vocab, [part], SERVED, [prefix])[0].tokens
        if previous is not None:
            prefix = whole_words(common_prefix(previous, tokens), vocab)
        previous = tokens
    return prefix


def _timed(runtime: CountingRuntime, vocab, audio, prefix) -> tuple[Transcript, float, int]:
    runtime.steps = 0
    started = time.perf_counter()
    result = transcribe(runtime, vocab, [audio], SERVED, [prefix])[0]
    return result, time.perf_counter() - started, runtime.steps


def run(every: list[float]) -> dict:
    folders = ensure_all(["asr_encoder", "asr_decoder"])
    runtime = CountingRuntime(
        OnnxWhisperRuntime(
            folders["asr_encoder"] / "model.onnx", folders["asr_decoder"] / DECODER_STEP_FILE, 1
        )
    )
    ct2 = packaged_ct2_dir()
    vocab = WhisperVocab.load(ct2 / "tokenizer.json", ct2 / "config.json")
    sets: dict[str, list[Clip]] = {"human": human_clips(), "voice": clips()[:-1]}
    results: dict = {"sets": {}}
    for name, items in sets.items():
        references = [c.text for c in items]
        rows: dict[str, dict] = {}
        settings: list[float | None] = [None, *every]
        prefixes = {e: [final_prefix(runtime, vocab, c.audio, e) for c in items] for e in every}
        timings: dict = {s: ([], [], []) for s in settings}
        for _ in range(2):  # alternated, twice: the machine is shared
            for setting in settings:
                texts, times, steps = timings[setting]
                texts.clear()
                for i, clip in enumerate(items):
                    prefix = [] if setting is None else prefixes[setting][i]
                    result, seconds, count = _timed(runtime, vocab, clip.audio, prefix)
                    texts.append(result.text)
                    times.append(seconds)
                    steps.append(count)
        for setting in settings:
            texts, times, steps = timings[setting]
            label = "no prefix" if setting is None else f"passes every {setting:g} s"
            rows[label] = {
                "every_s": setting,
                "wer": corpus_wer(references, texts),
                "ms_p50": float(np.percentile(times, 50) * 1000),
                "ms_p95": float(np.percentile(times, 95) * 1000),
                "decoder_steps": int(sum(steps) // 2),
                "prefix_tokens": None if setting is None else [len(p) for p in prefixes[setting]],
                "texts": texts,
            }
            log.info("%s %s: %s", name, label, {k: rows[label][k] for k in ("wer", "ms_p50")})
        results["sets"][name] = {
            "clips": len(items),
            "seconds": [round(c.seconds, 2) for c in items],
            "references": references,
            "settings": rows,
        }
    return results


def markdown(results: dict) -> str:
    def cells(key: str, row: dict, data: dict) -> list[str]:
        return [key, f"{row['wer']:.3f}", str(row["decoder_steps"]),
                f"{row['ms_p50']:.0f}", f"{row['ms_p95']:.0f}"]  # fmt: skip

    columns = ["final pass", "WER", "decoder steps", "ms p50", "ms p95"]
    return tables_per_set(results["sets"], columns, cells)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--every",
        nargs="*",
        type=float,
        default=list(EVERY_S),
        help="seconds of speech between passes (each setting in the same run)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    results = run(args.every)
    save_results(args.out, "prefix", results, markdown(results))
    return 0
