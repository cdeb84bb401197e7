"""A smaller model for captions: Whisper tiny.en vs the served Whisper base, WER and time.

`python -m perf asr-tiny` transcribes real speech with both models in one run, in-process
(ONNX Runtime, 1 thread, batch 1), with the served windowing (`serving.served.local_config`:
the `asr` model's window_step / window_margin, token caps and fallback; tiny.en told its one
language, "en"), and tiny.en once more with Whisper's own 30-s windows (window_step None:
on the served short windows it repeats itself, "10 of clubs. 10 of clubs. ..."):

- `human`: the 10 human recordings (evals.recordings, pocketsphinx-testdata, 1-7 s);
- `voice`: the packaged voice's clips (evals.clips.clips());
- `human first N s` (N = 1, 2, 3): the first N seconds of each human recording longer than
  N s, what a caption pass sees while the user speaks. The words said so far are not known:
  such a pass is scored against the start of its reference it is closest to (edits to the
  best reference prefix over that prefix's words), which does not count words not yet
  heard; `tiny vs base` (base's transcript as the reference) is scored as usual.

The two models alternate clip by clip (which goes first alternates too), so both see the
same load on the shared cores. Per set and model: corpus WER (case, punctuation and digits
vs words do not count, evals.wer), ms per utterance (encoder + greedy decoding) p50 / p95.
Written to build/perf/asr_tiny/tiny.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from importlib import resources
from pathlib import Path

import numpy as np

from avatar.asr.features import SAMPLE_RATE
from avatar.asr.greedy import WhisperRuntime
from avatar.asr.onnx_runtime import OnnxWhisperRuntime
from avatar.asr.transcribe import AsrOptions, transcribe
from avatar.asr.vocab import WhisperVocab
from evals.clips import Clip, clips
from evals.recordings import human_clips
from evals.report import DEFAULT_OUT, machine, save_results
from evals.wer import corpus_wer, prefix_errors

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "asr_tiny"
PREFIX_S = (1.0, 2.0, 3.0)
BASE, TINY, TINY_FULL = "base", "tiny.en", "tiny.en 30-s windows"
MODELS = (BASE, TINY, TINY_FULL)


@dataclasses.dataclass(frozen=True)
class Model:
    runtime: WhisperRuntime
    vocab: WhisperVocab
    options: AsrOptions


def models(threads: int = 1) -> dict[str, Model]:
    """The served base (the graphs the embedded server runs) and tiny.en, both with the
    served `asr` options."""
    from export.asr.tiny import build_tiny, tiny_runtime, tiny_vocab
    from serving.served import local_config, served_onnx, served_parameters

    served = local_config().asr
    data = resources.files(served_parameters("asr")["tokenizer_package"]) / "data"
    base_vocab = WhisperVocab.load(
        Path(str(data / "tokenizer.json")), Path(str(data / "config.json"))
    )
    base = OnnxWhisperRuntime(served_onnx("asr_encoder"), served_onnx("asr_decoder"), threads)
    english = dataclasses.replace(served.decode, language="en")
    tiny = tiny_runtime(*build_tiny(), threads=threads)
    tiny_served = dataclasses.replace(served, decode=english)
    return {
        BASE: Model(base, base_vocab, served),
        TINY: Model(tiny, tiny_vocab(), tiny_served),
        # Whisper's own 30-s window (tiny.en loops on the served short windows)
        TINY_FULL: Model(tiny, tiny_vocab(), dataclasses.replace(tiny_served, window_step=None)),
    }


def prefix_wer(references: list[str], hypotheses: list[str]) -> float:
    pairs = [prefix_errors(r, h) for r, h in zip(references, hypotheses, strict=True)]
    return sum(e for e, _ in pairs) / max(1, sum(n for _, n in pairs))


def clip_sets() -> dict[str, tuple[list[Clip], bool]]:
    """name -> (clips, whether they are prefixes of longer speech)."""
    human = human_clips()
    sets = {"human": (human, False), "voice": (clips(), False)}
    for seconds in PREFIX_S:
        cut = int(seconds * SAMPLE_RATE)
        first = [Clip(c.text, c.audio[:cut]) for c in human if len(c.audio) > cut]
        sets[f"human first {seconds:g} s"] = (first, True)
    return sets


def _timed(model: Model, audio: np.ndarray) -> tuple[str, float]:
    started = time.perf_counter()
    (result,) = transcribe(model.runtime, model.vocab, [audio], model.options)
    return result.text, time.perf_counter() - started


def run(repeat: int = 1, threads: int = 1) -> dict:
    loaded = models(threads)
    sets = clip_sets()
    first = sets["human"][0][0].audio
    for model in loaded.values():  # warm-up, untimed
        _timed(model, first)
    results: dict = {"threads": threads, "repeat": repeat, "machine": machine(), "sets": {}}
    for name, (items, partial) in sets.items():
        texts: dict[str, list[str]] = {m: [] for m in MODELS}
        times: dict[str, list[float]] = {m: [] for m in MODELS}
        for i, clip in enumerate(items):
            for m in MODELS if i % 2 == 0 else MODELS[::-1]:  # alternated, clip by clip
                for _ in range(repeat):
                    text, seconds = _timed(loaded[m], clip.audio)
                    times[m].append(seconds)
                texts[m].append(text)
        references = [c.text for c in items]
        score = prefix_wer if partial else corpus_wer
        rows = {
            m: {
                "wer": score(references, texts[m]),
                "ms_p50": float(np.percentile(times[m], 50) * 1000),
                "ms_p95": float(np.percentile(times[m], 95) * 1000),
                "vs_base_wer": corpus_wer(texts[BASE], texts[m]),  # base's words as reference
                "texts": texts[m],
            }
            for m in MODELS
        }
        results["sets"][name] = {
            "clips": len(items),
            "seconds": [round(c.seconds, 2) for c in items],
            "prefix_scoring": partial,
            "references": references,
            "models": rows,
        }
        log.info(
            "%s: %s", name, {m: (round(r["wer"], 3), round(r["ms_p50"])) for m, r in rows.items()}
        )
    results["machine_after"] = machine()
    return results


def markdown(results: dict) -> str:
    lines = [
        f"Whisper tiny.en vs the served base, in-process ONNX Runtime, {results['threads']} "
        f"thread(s), served windowing unless stated; load (1, 5, 15 min) "
        f"{results['machine']['load_1m_5m_15m']} -> {results['machine_after']['load_1m_5m_15m']}",
        "",
        "| set | clips | model | WER | vs base (points) | WER vs base's text | ms p50 | ms p95 "
        "| p50 speed-up |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, data in results["sets"].items():
        base = data["models"][BASE]
        mark = " *" if data["prefix_scoring"] else ""
        for model, row in data["models"].items():
            lines.append(
                f"| {name}{mark} | {data['clips']} | {model} | {row['wer']:.3f} "
                f"| {(row['wer'] - base['wer']) * 100:+.1f} | {row['vs_base_wer']:.3f} "
                f"| {row['ms_p50']:.0f} | {row['ms_p95']:.0f} "
                f"| {base['ms_p50'] / row['ms_p50']:.1f}x |"
            )
    lines += [
        "",
        "\\* scored against the closest start of the reference (words not yet heard do not "
        "count). WER vs base's text: the model's words against base's transcript of the same "
        "audio.",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per clip and model")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    results = run(args.repeat, args.threads)
    save_results(args.out, "tiny", results, markdown(results))
    return 0
