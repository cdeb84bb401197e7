"""ASR in proportion to the audio: encoder window length vs word error rate and time.

`python -m perf asr-windows` transcribes real human recordings (Debian pocketsphinx-testdata,
`export.asr.human`) and the packaged-voice clips (`export.asr.clips`) with the exported
encoder/decoder in ONNX Runtime, once per window setting, in one run:

- `full`: every window padded to 3000 mel frames (30 s), the release behaviour;
- `step N + M`: the speech plus at least M frames of padding, rounded up to a multiple of
  N frames (100 frames per second);
- a setting ending in `/notimestamps`: the same window decoded with `<|notimestamps|>`
  (text tokens only: no segment times, fewer decoder steps), as a live turn may ask.

Per setting: corpus WER against the reference transcripts (case, punctuation and digits vs
words do not count, `export.asr.wer`), transcripts that differ from the full-window ones,
and the time per utterance (encoder + greedy decoding, 1 thread, batch 1), median and p95.
Written to build/perf/asr/windows.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np

from avatar.asr.greedy import DecodeOptions
from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
from avatar.asr.transcribe import AsrOptions, transcribe
from avatar.asr.vocab import WhisperVocab
from evals.clips import Clip, clips
from evals.recordings import human_clips
from evals.report import DEFAULT_OUT, save_results, tables_per_set
from evals.wer import corpus_wer
from export.asr.weights import packaged_ct2_dir
from export.registry import ensure_all

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "asr"
NO_TIMESTAMPS = "/notimestamps"
# (step, margin, timestamps): step and margin in mel frames (100 per second); (None, 0) is
# the 30-s window
Setting = tuple[int | None, int, bool]
SETTINGS: tuple[Setting, ...] = (
    (None, 0, True),
    (1000, 0, True),
    (500, 0, True),
    (100, 0, True),
    (100, 100, True),
    (100, 200, True),
    (100, 300, True),
)


def label(step: int | None, margin: int = 0, timestamps: bool = True) -> str:
    name = "full" if step is None else f"step {step}" + (f" + {margin}" if margin else "")
    return name + ("" if timestamps else " no timestamps")


def parse_setting(text: str) -> Setting:
    """ "full", "500", "100+200" or "100+300/notimestamps" -> (step, margin, timestamps)."""
    timestamps = not text.endswith(NO_TIMESTAMPS)
    text = text.removesuffix(NO_TIMESTAMPS)
    if text == "full":
        return None, 0, timestamps
    step, _, margin = text.partition("+")
    return int(step), int(margin or 0), timestamps


def run(settings=SETTINGS, repeat: int = 1, threads: int = 1) -> dict:
    """Transcripts, WER and times of every clip set under every window setting."""
    folders = ensure_all(["asr_encoder", "asr_decoder"])
    runtime = OnnxWhisperRuntime(
        folders["asr_encoder"] / "model.onnx", folders["asr_decoder"] / DECODER_STEP_FILE, threads
    )
    ct2 = packaged_ct2_dir()
    vocab = WhisperVocab.load(ct2 / "tokenizer.json", ct2 / "config.json")
    sets: dict[str, list[Clip]] = {"human": human_clips(), "voice": clips()[:-1]}
    results: dict = {"threads": threads, "repeat": repeat, "sets": {}}
    for set_name, items in sets.items():
        rows = {}
        for step, margin, timestamps in settings:
            name = label(step, margin, timestamps)
            options = AsrOptions(
                decode=DecodeOptions(timestamps=timestamps), window_step=step, window_margin=margin
            )
            texts, times = [], []
            for clip in items:
                for _ in range(repeat):
                    started = time.perf_counter()
                    text = transcribe(runtime, vocab, [clip.audio], options)[0].text
                    times.append(time.perf_counter() - started)
                texts.append(text)
            rows[name] = {
                "step": step,
                "margin": margin,
                "timestamps": timestamps,
                "wer": corpus_wer([c.text for c in items], texts),
                "ms_p50": float(np.percentile(times, 50) * 1000),
                "ms_p95": float(np.percentile(times, 95) * 1000),
                "texts": texts,
            }
            log.info("%s %s: WER %.3f", set_name, name, rows[name]["wer"])
        full = rows["full"]["texts"] if "full" in rows else None
        for row in rows.values():
            pairs = [] if full is None else zip(row["texts"], full, strict=True)
            row["differs_from_full"] = None if full is None else sum(a != b for a, b in pairs)
        results["sets"][set_name] = {
            "clips": len(items),
            "seconds": [round(c.seconds, 2) for c in items],
            "references": [c.text for c in items],
            "settings": rows,
        }
    return results


def markdown(results: dict) -> str:
    def cells(key: str, row: dict, data: dict) -> list[str]:
        full = data["settings"].get("full")
        delta = "" if full is None else f"{(row['wer'] - full['wer']) * 100:+.1f}"
        return [key, f"{row['wer']:.3f}", delta, str(row["differs_from_full"]),
                f"{row['ms_p50']:.0f}", f"{row['ms_p95']:.0f}"]  # fmt: skip

    columns = ["window", "WER", "WER vs full (points)", "transcripts != full", "ms p50", "ms p95"]
    return tables_per_set(results["sets"], columns, cells)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--settings",
        nargs="*",
        type=parse_setting,
        default=list(SETTINGS),
        help='windows to compare: "full", STEP or STEP+MARGIN in mel frames (100 per second), '
        f"each optionally ending in {NO_TIMESTAMPS}",
    )
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per clip")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    results = run(args.settings, args.repeat, args.threads)
    save_results(args.out, "windows", results, markdown(results))
    return 0
