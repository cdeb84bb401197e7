"""Each network alone, no server: CUDA events on a GPU (wall time on a CPU), per batch,
the LLM's prefill, and optionally each network replayed as a CUDA graph."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from perf.gpu_stages.networks import LLM_KV, PROMPT_TOKENS, STAGES, VOCAB_LLM, Stage, ids, kv

log = logging.getLogger(__name__)


def summary(values_ms: list[float]) -> dict[str, float]:
    ordered = sorted(values_ms)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return {"p50": round(statistics.median(ordered), 3), "p95": round(p95, 3), "n": len(ordered)}


def time_call(torch, device, call: Callable[[], Any], reps: int, warmup: int = 3) -> list[float]:
    """Milliseconds per call: CUDA events on a GPU (device time, synchronised), else wall."""
    with torch.inference_mode():
        for _ in range(warmup):
            call()
        out = []
        for _ in range(reps):
            if device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                call()
                out.append((time.perf_counter() - t0) * 1000)
    return out


def in_process(
    device_name: str, reps: int, batches: tuple[int, ...], graphs: bool = False
) -> dict[str, Any]:
    """Each network alone, no server: the floor the served stage is compared with."""
    import torch

    device = torch.device(device_name)
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    for stage in STAGES.values():
        try:
            results[stage.name] = time_stage(torch, device, stage, reps, batches, graphs=graphs)
        except Exception as exc:  # report and go on: one failing stage is not all
            log.exception("stage %s failed", stage.name)
            results[stage.name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def time_stage(
    torch, device, stage: Stage, reps: int, batches: tuple[int, ...], *, graphs: bool = False
) -> dict:
    forward = stage.build(torch, device)
    rows = {}
    for batch in batches:
        inputs = stage.example(torch, device, batch)
        rows[f"batch{batch}"] = summary(
            time_call(torch, device, lambda f=forward, i=inputs: f(**i), reps)
        )
    if stage.name == "llm_decoder":  # the prompt's prefill: one call over 320 tokens
        prompt = ids(torch, device, 1, PROMPT_TOKENS, VOCAB_LLM)
        empty = kv(torch, device, (1, LLM_KV[0], LLM_KV[1], 0, LLM_KV[3]))
        rows["prefill"] = summary(
            time_call(torch, device, lambda f=forward: f(prompt, empty), reps)
        )
    if graphs and device.type == "cuda" and stage.name != "tts_vits":  # VITS: data-dependent
        example = stage.example(torch, device, 1)
        try:
            rows["graph_batch1"] = summary(graph_replay_ms(torch, forward, example, reps))
        except Exception as exc:  # e.g. a host sync inside the network: not capturable
            rows["graph_batch1"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return rows


def graph_replay_ms(torch, forward, inputs: dict[str, Any], reps: int) -> list[float]:
    """The network captured once as a CUDA graph and replayed: its kernels without Python's
    launch cost, about what a TensorRT engine's enqueue pays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(3):  # warm-up on the side stream, as capture requires
            forward(**inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        forward(**inputs)
    return time_call(torch, torch.device("cuda"), graph.replay, reps)
