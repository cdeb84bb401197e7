"""Transcription through tritonserver against the same networks in-process, side by side in
one run (printed and written, never asserted): utterances/s and ms per utterance at 1, 4 and
8 concurrent streams, on the real human recordings (pocketsphinx-testdata) as the `asr`
model serves them (windows of the speech plus 3 s, model_repository/asr/config.pbtxt).

Through Triton, the `asr` BLS model encodes each window once with `asr_encoder` and decodes
it as a sequence of `asr_decoder`, which keeps the window's caches (embedded:
avatar/triton/whisper_runner.py). In-process, ONNX Runtime runs the same encoder and step
graphs (1 thread) with the caches held in the process, the requests of a load level decoded
as one lockstep batch, as the `asr` model batches concurrent requests.

    python -m perf asr-server [--rounds 3] [--url URL] [--against URL] [--out build/perf/asr_server]

`--against URL`: a second server with an `asr` model (e.g. the previous release, started
from its own checkout) measured in the same rounds, so a change is a ratio from one run.
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import time
from pathlib import Path

import numpy as np

from avatar.model_io import ASR, infer_inputs
from evals.report import DEFAULT_OUT, save_results
from perf.harness import at_concurrency, percentile, serve, warm_up

log = logging.getLogger(__name__)

MODELS = ("asr", "asr_encoder", "asr_decoder")
STREAMS = (1, 4, 8)


def transcribe_served(url: str, audio: np.ndarray) -> str:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = infer_inputs(ASR.request(audio=np.asarray(audio, np.float32)), grpcclient.InferInput)
    result = client.infer("asr", inputs, outputs=[grpcclient.InferRequestedOutput("text")])
    return ASR.read_response({"text": result.as_numpy("text")})["text"]


def through_triton(url: str, audios: list[np.ndarray], streams: int) -> tuple[float, list[float]]:
    """(utterances/s, client ms per utterance): `streams` clients, each sending its share of
    the clips one after another."""
    load = at_concurrency(streams, audios, functools.partial(transcribe_served, url))
    if load.errors:
        raise RuntimeError(f"{len(load.errors)} of {len(audios)} transcriptions failed")
    return load.per_s, [1000 * s.seconds for s in load.samples]


def in_process(runtime, vocab, audios: list[np.ndarray], streams: int) -> tuple[float, list[float]]:
    """The same clips in lockstep batches of `streams` (ms per utterance: its batch's time)."""
    from avatar.asr.transcribe import transcribe
    from evals.asr import SERVED

    times: list[float] = []
    started = time.perf_counter()
    for first in range(0, len(audios), streams):
        batch = audios[first : first + streams]
        t = time.perf_counter()
        transcribe(runtime, vocab, batch, SERVED)
        times += [1000 * (time.perf_counter() - t)] * len(batch)
    return len(audios) / (time.perf_counter() - started), times


def measure(
    urls: dict[str, str], rounds: int, streams_levels=STREAMS, utterances: int = 20
) -> list[dict]:
    """Rounds alternate in-process and each server for each stream count (all warmed).
    `utterances`: how many of the human recordings (cycled) make one round."""
    from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
    from avatar.asr.vocab import WhisperVocab
    from evals.recordings import human_clips
    from export.asr.weights import packaged_ct2_dir
    from export.registry import ensure_all

    art = ensure_all(["asr_encoder", "asr_decoder"])
    runtime = OnnxWhisperRuntime(
        art["asr_encoder"] / "model.onnx", art["asr_decoder"] / DECODER_STEP_FILE
    )
    ct2 = packaged_ct2_dir()
    vocab = WhisperVocab.load(ct2 / "tokenizer.json", ct2 / "config.json")
    humans = [c.audio for c in human_clips()]  # 10 recordings of 1-7 s
    audios = [humans[i % len(humans)] for i in range(utterances)]
    in_process(runtime, vocab, audios[:2], 1)
    for url in urls.values():
        warm_up(functools.partial(transcribe_served, url), audios[:2])
    rows = []
    for streams in streams_levels:
        rates: dict[str, list[float]] = {"in_process": [], **{k: [] for k in urls}}
        times: dict[str, list[float]] = {k: [] for k in rates}
        for _ in range(rounds):
            rate, ms = in_process(runtime, vocab, audios, streams)
            rates["in_process"].append(rate)
            times["in_process"] += ms
            for name, url in urls.items():
                rate, ms = through_triton(url, audios, streams)
                rates[name].append(rate)
                times[name] += ms
        row: dict = {"streams": streams, "rounds": rounds, "utterances": len(audios)}
        for name, rate in rates.items():
            row[name] = {
                "per_s": statistics.median(rate),
                "ms_p50": percentile(times[name], 50),
                "ms_p95": percentile(times[name], 95),
            }
        for name in urls:
            row[name]["vs_in_process"] = row[name]["per_s"] / row["in_process"]["per_s"]
        rows.append(row)
        log.info("%d streams: %s", streams, row)
    return rows


def table(rows: list[dict]) -> str:
    names = [k for k, v in rows[0].items() if isinstance(v, dict)]
    lines = [
        f"utterances/s (median of {rows[0]['rounds']} rounds of {rows[0]['utterances']} human "
        "recordings) and ms per utterance p50 / p95; ratio: utterances/s against in-process",
        "streams  " + "  ".join(f"{n:>30}" for n in names),
    ]
    for r in rows:
        cells = []
        for n in names:
            v = r[n]
            ratio = f" {v['vs_in_process']:.2f}x" if "vs_in_process" in v else ""
            cells.append(f"{v['per_s']:5.2f}/s {v['ms_p50']:5.0f}/{v['ms_p95']:5.0f} ms{ratio:>6}")
        lines.append(f"{r['streams']:>7}  " + "  ".join(f"{c:>30}" for c in cells))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, nargs="+", default=list(STREAMS))
    parser.add_argument("--utterances", type=int, default=20, help="per round")
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--against", default=None, help="gRPC URL of another server's asr")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "asr_server")
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    with serve(args.url, MODELS) as target:
        urls = {"triton": target.grpc_url} | ({"against": args.against} if args.against else {})
        rows = measure(urls, args.rounds, args.streams, args.utterances)
    save_results(args.out, "asr_server", rows, table(rows))
    return 0
