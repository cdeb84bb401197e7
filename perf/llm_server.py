"""Generation through tritonserver against the same engine in-process, side by side in one
run (printed and written, never asserted): aggregate tokens/s at 1/4/8 concurrent streams
and time to first token.

Through Triton, the `llm` BLS model sends each decode step as one request per stream to
`llm_decoder`, which keeps the KV caches (sequence batching with implicit state; embedded:
avatar/triton/sequence_runner.py). In-process, the same scheduler runs the same decoder
code directly (avatar.llm.sequences.KvCacheSequences over ONNX Runtime, 1 thread). Both get
the same sampled requests (same seeds), so both generate the same tokens.

    python -m perf llm-server [--rounds 3] [--out build/perf/llm_server]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import queue
import statistics
import time
from pathlib import Path

from avatar.model_io import LLM, infer_inputs
from evals.llm_generation import QUESTIONS
from evals.report import DEFAULT_OUT, save_results
from perf.harness import at_concurrency, serve, warm_up

log = logging.getLogger(__name__)

MODELS = ("llm", "llm_decoder")
STREAMS = (1, 4, 8)
MAX_TOKENS = 48
# the `llm` model's default sampling (model_repository/llm/config.pbtxt), stated per request
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1}


def _sampling(seed: int) -> dict:
    return {**SAMPLING, "seed": seed, "max_tokens": MAX_TOKENS}


def _question(i: int) -> list[dict]:
    return [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]


def stream_turn(url: str, messages: list[dict], sampling: dict) -> tuple[float, int, dict]:
    """One streamed turn: (client-side ms to the first text, text responses, final stats)."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    tensors = infer_inputs(LLM.request(messages=messages, sampling=sampling), grpcclient.InferInput)
    started, first, count = time.monotonic(), None, 0
    try:
        client.async_stream_infer("llm", tensors)
        while True:
            result, error = results.get(timeout=300)
            if error is not None:
                raise RuntimeError(str(error))
            out = LLM.read_response({name: result.as_numpy(name) for name in LLM.outputs})
            if out["text"] and first is None:
                first = (time.monotonic() - started) * 1000
            count += bool(out["text"])
            if out["finish_reason"]:
                return first or 0.0, count, out["stats"]
    finally:
        client.stop_stream()
        client.close()


def decoder_counts(url: str) -> tuple[int, int]:
    """Triton's statistics of `llm_decoder`: (requests, executions) so far."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics("llm_decoder", as_json=True)["model_stats"]
    return (
        sum(int(s.get("inference_count", 0)) for s in stats),
        sum(int(s.get("execution_count", 0)) for s in stats),
    )


def through_triton(url: str, streams: int) -> tuple[float, list[float]]:
    """(aggregate tokens/s, server-side ttft_ms per stream) of `streams` concurrent turns."""
    load = at_concurrency(streams, range(streams), functools.partial(served_turn, url))
    if load.errors:
        raise RuntimeError(f"{len(load.errors)} of {streams} streams failed")
    stats = [s.result for s in load.samples]
    return sum(s["completion_tokens"] for s in stats) / load.wall_s, [s["ttft_ms"] for s in stats]


def served_turn(url: str, i: int) -> dict:
    """Question i with seed i through the `llm` model: its final stats."""
    return stream_turn(url, _question(i), _sampling(i))[2]


def in_process(engine, streams: int) -> tuple[float, list[float]]:
    """The same turns on an in-process engine whose scheduler runs in its own thread."""
    finals: queue.Queue = queue.Queue()
    started = time.monotonic()
    for i in range(streams):
        request = engine.parse(json.dumps(_question(i)), "", json.dumps(_sampling(i)))
        engine.submit(request, lambda e: e.finish_reason and finals.put(e.stats))
    stats = [finals.get(timeout=300) for _ in range(streams)]
    elapsed = time.monotonic() - started
    return sum(s["completion_tokens"] for s in stats) / elapsed, [s["ttft_ms"] for s in stats]


def _engine(folder: Path):
    from avatar.llm.decoder import OrtDecoder
    from avatar.llm.engine import ChatEngine, EngineConfig
    from avatar.llm.tokenizer import Tokenizer
    from serving.served import served_onnx

    engine = ChatEngine(
        OrtDecoder(served_onnx("llm_decoder"), threads=1), Tokenizer(folder), EngineConfig()
    )
    engine.scheduler.start()
    return engine


def measure(url: str, folder: Path, rounds: int) -> list[dict]:
    """Rounds alternate in-process and Triton for each stream count (both warmed first)."""
    engine = _engine(folder)
    try:
        in_process(engine, 1)  # warm-up: the persona reaches both prefix caches
        warm_up(functools.partial(served_turn, url), [0])
        rows = []
        for streams in STREAMS:
            local, served, ttft_local, ttft_served = [], [], [], []
            requests, executions = decoder_counts(url)
            for _ in range(rounds):
                rate, ttft = in_process(engine, streams)
                local.append(rate)
                ttft_local += ttft
                rate, ttft = through_triton(url, streams)
                served.append(rate)
                ttft_served += ttft
            requests_after, executions_after = decoder_counts(url)
            rows.append(
                {
                    "streams": streams,
                    # steps per llm_decoder execution: the sequence batcher's batches
                    "mean_decoder_batch": (requests_after - requests)
                    / max(1, executions_after - executions),
                    "in_process_tokens_per_s": statistics.median(local),
                    "triton_tokens_per_s": statistics.median(served),
                    "ratio": statistics.median(served) / statistics.median(local),
                    "in_process_ttft_ms_p50": statistics.median(ttft_local),
                    "triton_ttft_ms_p50": statistics.median(ttft_served),
                    "rounds": rounds,
                }
            )
            log.info("%d streams: %s", streams, rows[-1])
        return rows
    finally:
        engine.scheduler.stop()


def table(rows: list[dict]) -> str:
    lines = [
        f"tokens/s, median of {rows[0]['rounds']} rounds ({MAX_TOKENS} tokens max per stream,",
        "sampled, prefill included); ttft: server-side, p50 over the rounds' streams",
        "streams  in-process  through Triton  ratio   ttft in-process  ttft Triton  batch",
    ]
    lines += [
        f"{r['streams']:>7}  {r['in_process_tokens_per_s']:>10.1f}  "
        f"{r['triton_tokens_per_s']:>14.1f}  {r['ratio']:>5.2f}   "
        f"{r['in_process_ttft_ms_p50']:>12.0f} ms  {r['triton_ttft_ms_p50']:>8.0f} ms  "
        f"{r['mean_decoder_batch']:>5.2f}"
        for r in rows
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "llm_server")
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from export.registry import ensure_all

    folder = ensure_all(["llm_decoder"])["llm_decoder"]
    with serve(models=MODELS) as target:
        rows = measure(target.grpc_url, folder, args.rounds)
    save_results(args.out, "llm_server", rows, table(rows))
    return 0
