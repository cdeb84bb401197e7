"""Sessions per GPU: N concurrent sessions, each running the served turn's critical path
(the BLS chain of perf.gpu_stages.chain through the wheel's tritonserver, outputs on the GPU) again
and again, paced as a person talks: a turn, then a pause of listening and speaking.

    python -m perf gpu-stages --sessions 1 2 4 8 16 32 64
    python -m perf gpu-stages --device cpu --sessions 1 2 --level-s 4   # the code path, a CPU

Each level is one request to the `turn_chain` model, whose execute runs the sessions as
threads (every stage call a BLS request of its own, so Triton queues them per stage model as
it would the calls of separate sessions). A session starts a pause's fraction after the
previous one, runs a turn, waits `pause_s` (x0.75..1.25, seeded) and runs the next until
`level_s` has passed. A turn's figure is its end of speech -> first audio compute: the sum of
the critical path's stage calls, queueing included. Per level: p50/p95, turns per second,
each stage model's mean queue and compute time (Triton's statistics); at the end, the
largest level whose p95 is within the limit (2 s): the "sessions per machine" figure.

What it is not: the live gateway (no audio, no captions, no later sentences' LLM steps and
TTS while the avatar speaks); random weights (kernels' time depends on shapes, not values).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from perf.gpu_stages import chain
from perf.gpu_stages.served import ROOT, model_stats, run_chain, serving
from perf.gpu_stages.timing import summary

OUT = ROOT / "build/perf/gpu_stages/capacity.json"
TRANSCRIPT = ("asr_encoder", "asr_decoder")  # the chain's stages that make a transcript
LIMIT_MS = 2000.0


def paced_sessions(
    torch,
    device,
    call: Callable[[str, dict[str, Any]], dict[str, Any]],
    *,
    sessions: int,
    level_s: float,
    pause_s: float,
    seed: int = 0,
    models: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run inside the BLS model: `sessions` paced sessions of chained turns at once.

    Returns every turn (session, start and end in s since the level began, ms per stage)
    and the level's wall time."""
    start = time.perf_counter()
    turns: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def session(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        time.sleep(pause_s * index / sessions)  # staggered starts, spread over one pause
        while True:
            began = time.perf_counter() - start
            try:
                ms = chain.chain_once(torch, device, call, models)
            except Exception as exc:  # reported with the level
                with lock:
                    errors.append(f"session {index}: {type(exc).__name__}: {exc}"[:500])
                return
            ended = time.perf_counter() - start
            with lock:
                turns.append({"session": index, "start_s": began, "end_s": ended, "ms": ms})
            pause = pause_s * rng.uniform(0.75, 1.25)
            if ended + pause >= level_s:
                return
            time.sleep(pause)

    threads = [
        threading.Thread(target=session, args=(i,), name=f"session-{i}") for i in range(sessions)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"turns": turns, "errors": errors, "wall_s": time.perf_counter() - start}


def first_audio_ms(turn: dict[str, Any]) -> float:
    """End of speech -> first audio: the critical path's stage calls, queueing included."""
    return sum(turn["ms"].get(label, 0.0) for label in chain.CRITICAL_PATH)


def summarise_level(sessions: int, answer: dict[str, Any]) -> dict[str, Any]:
    """One level's row: first-audio p50/p95 (ms), turns, turns per second, stage p50s."""
    turns = answer["turns"]
    row: dict[str, Any] = {
        "sessions": sessions,
        "turns": len(turns),
        "errors": answer.get("errors", []),
        "wall_s": round(answer["wall_s"], 2),
        "turns_per_s": round(len(turns) / answer["wall_s"], 3) if answer["wall_s"] else 0.0,
    }
    if turns:
        row["first_audio_ms"] = summary([first_audio_ms(t) for t in turns])
        row["stage_p50_ms"] = {
            label: summary([t["ms"].get(label, 0.0) for t in turns])["p50"]
            for label in chain.CRITICAL_PATH
        }
        # what the end of turn waits for at a pause (perf turn-taking --transcript-ms,
        # --ask-latency-ms): the transcript of the audio so far, and the audio model's answer
        row["transcript_ms"] = summary(
            [sum(t["ms"].get(s, 0.0) for s in TRANSCRIPT) for t in turns]
        )
        row["turn_detector_ms"] = summary([t["ms"].get("turn_detector", 0.0) for t in turns])
    return row


def largest_within(rows: list[dict[str, Any]], limit_ms: float = LIMIT_MS) -> int | None:
    """The largest level whose turns all ran and whose first-audio p95 is within the limit."""
    ok = [
        row["sessions"]
        for row in rows
        if row["turns"] and not row["errors"] and row["first_audio_ms"]["p95"] <= limit_ms
    ]
    return max(ok) if ok else None


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each model's requests, mean queue and compute ms between two reads of Triton's stats."""

    def table(stats: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
        out = {}
        for model in stats["model_stats"]:
            s = model["inference_stats"]
            out[model["name"]] = (
                int(s["success"]["count"]),
                int(s["queue"]["ns"]),
                int(s["compute_infer"]["ns"]),
            )
        return out

    old, new = table(before), table(after)
    delta = {}
    for name, (count, queue, compute) in new.items():
        c0, q0, x0 = old.get(name, (0, 0, 0))
        if count > c0:
            n = count - c0
            delta[name] = {
                "requests": n,
                "queue_ms": round((queue - q0) / n / 1e6, 2),
                "compute_ms": round((compute - x0) / n / 1e6, 2),
            }
    return delta


def format_table(rows: list[dict[str, Any]], limit_ms: float = LIMIT_MS) -> list[str]:
    """Markdown lines: one per level, then the largest level within the limit."""
    lines = [
        "| sessions | turns | turns/s | first audio p50 (ms) | p95 (ms) | transcript p50 / p95 "
        "(ms) | turn_detector p50 / p95 (ms) | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    nan = {"p50": float("nan"), "p95": float("nan")}
    for row in rows:
        fa = row.get("first_audio_ms", nan)
        asr, td = row.get("transcript_ms", nan), row.get("turn_detector_ms", nan)
        lines.append(
            f"| {row['sessions']} | {row['turns']} | {row['turns_per_s']:.2f} | "
            f"{fa['p50']:.0f} | {fa['p95']:.0f} | {asr['p50']:.0f} / {asr['p95']:.0f} | "
            f"{td['p50']:.1f} / {td['p95']:.1f} | {len(row['errors'])} |"
        )
    best = largest_within(rows, limit_ms)
    lines.append(f"largest level with first-audio p95 <= {limit_ms / 1000:g} s: {best}")
    return lines


def sweep(
    device_name: str,
    levels: list[int],
    level_s: float,
    pause_s: float,
    *,
    instances: int = 1,
    stop_p95_ms: float = 2 * LIMIT_MS,
) -> dict[str, Any]:
    """Start the server once, warm the chain, then one request per level (ascending); stop
    after a level whose p95 exceeds `stop_p95_ms` (the levels above it only queue more)."""
    extra: tuple[str, ...] = ()
    if device_name == "cuda":  # room for many sessions' GPU tensors in flight at once
        extra = ("--cuda-memory-pool-byte-size=0:4294967296",)
    rows: list[dict[str, Any]] = []
    with serving(device_name, instances, extra) as url:
        warm = run_chain(url, 2)
        on_gpu = warm["outputs_on_gpu"]
        for sessions in sorted(levels):
            before = model_stats(url)
            answer = run_chain(
                url, 1, {"sessions": sessions, "level_s": level_s, "pause_s": pause_s}
            )
            row = summarise_level(sessions, answer)
            row["models"] = stats_delta(before, model_stats(url))
            rows.append(row)
            print(format_table([row])[2], flush=True)
            print("level", json.dumps(row), flush=True)  # kept if a later level is cut off
            if row["errors"] or row.get("first_audio_ms", {}).get("p95", 0.0) > stop_p95_ms:
                break
    return {
        "settings": {
            "levels": sorted(levels),
            "level_s": level_s,
            "pause_s": pause_s,
            "instances": instances,
            "stop_p95_ms": stop_p95_ms,
            "limit_ms": LIMIT_MS,
        },
        "outputs_on_gpu": on_gpu,
        "levels": rows,
        "largest_within_limit": largest_within(rows),
    }
