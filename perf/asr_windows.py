"""ASR in proportion to the audio: encoder window length vs word error rate and time.

`python -m perf asr-windows` transcribes real human recordings (Debian pocketsphinx-testdata,
`export.asr.human`) and the packaged-voice clips (`export.asr.clips`) with the exported
encoder/decoder in ONNX Runtime, once per window setting, in one run:

- `full`: every window padded to 3000 mel frames (30 s), the release behaviour;
- `step N`: a window padded only to the next multiple of N frames (N/100 s).

Per setting: corpus WER against the reference transcripts (case, punctuation and digits vs
words do not count, `export.asr.wer`), transcripts that differ from the full-window ones,
and the time per utterance (encoder + greedy decoding, 1 thread, batch 1), median and p95.
Written to build/perf/asr/windows.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from avatar.asr.onnx_runtime import OnnxWhisperRuntime
from avatar.asr.transcribe import AsrOptions, transcribe
from avatar.asr.vocab import WhisperVocab
from export.asr.clips import Clip, clips
from export.asr.human import human_clips
from export.asr.weights import packaged_ct2_dir
from export.asr.wer import corpus_wer
from export.registry import ensure_all
from perf.report import DEFAULT_OUT

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "asr"
STEPS: tuple[int | None, ...] = (None, 1000, 500, 300, 100)


def label(step: int | None) -> str:
    return "full" if step is None else f"step {step}"


def run(steps=STEPS, repeat: int = 1, threads: int = 1) -> dict:
    """Transcripts, WER and times of every clip set under every window setting."""
    folders = ensure_all(["asr_encoder", "asr_decoder"])
    runtime = OnnxWhisperRuntime(
        folders["asr_encoder"] / "model.onnx", folders["asr_decoder"] / "model.onnx", threads
    )
    ct2 = packaged_ct2_dir()
    vocab = WhisperVocab.load(ct2 / "tokenizer.json", ct2 / "config.json")
    sets: dict[str, list[Clip]] = {"human": human_clips(), "voice": clips()[:-1]}
    results: dict = {"threads": threads, "repeat": repeat, "sets": {}}
    for name, items in sets.items():
        rows = {}
        for step in steps:
            options = AsrOptions(window_step=step)
            texts, times = [], []
            for clip in items:
                for _ in range(repeat):
                    started = time.perf_counter()
                    text = transcribe(runtime, vocab, [clip.audio], options)[0].text
                    times.append(time.perf_counter() - started)
                texts.append(text)
            rows[label(step)] = {
                "step": step,
                "wer": corpus_wer([c.text for c in items], texts),
                "ms_p50": float(np.percentile(times, 50) * 1000),
                "ms_p95": float(np.percentile(times, 95) * 1000),
                "texts": texts,
            }
            log.info("%s %s: WER %.3f", name, label(step), rows[label(step)]["wer"])
        full = rows[label(None)]["texts"] if None in steps else None
        for row in rows.values():
            pairs = [] if full is None else zip(row["texts"], full, strict=True)
            row["differs_from_full"] = None if full is None else sum(a != b for a, b in pairs)
        results["sets"][name] = {
            "clips": len(items),
            "seconds": [round(c.seconds, 2) for c in items],
            "references": [c.text for c in items],
            "settings": rows,
        }
    return results


def markdown(results: dict) -> str:
    lines = []
    for name, data in results["sets"].items():
        seconds = data["seconds"]
        lines += [
            f"**{name}**: {data['clips']} clips, {min(seconds):.1f}-{max(seconds):.1f} s",
            "",
            "| window | WER | WER vs full (points) | transcripts != full | ms p50 | ms p95 |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        full = data["settings"].get("full")
        for key, row in data["settings"].items():
            delta = "" if full is None else f"{(row['wer'] - full['wer']) * 100:+.1f}"
            lines.append(
                f"| {key} | {row['wer']:.3f} | {delta} | {row['differs_from_full']} "
                f"| {row['ms_p50']:.0f} | {row['ms_p95']:.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, nargs="*", help="window steps (0 = full)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per clip")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    steps = STEPS if args.steps is None else tuple(s or None for s in args.steps)
    results = run(steps, args.repeat, args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "windows.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (args.out / "windows.md").write_text(table)
    print(table)
    return 0
