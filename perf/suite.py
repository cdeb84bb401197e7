"""`python -m perf suite`: perf_analyzer over every public model and the `avatar` stream.

Realistic inputs (perf/inputs.py): real speech of the packaged voice for vad/asr/avatar,
real reply sentences for tts/avatar_say, real questions with a fixed seed and max_tokens
for llm/avatar, real animation frames for the renderer. The decoupled models (tts, llm,
avatar) run over a gRPC stream (`--streaming`); their latency is request to final response.
Each concurrency level measures a fixed number of requests (a shared machine never meets
perf_analyzer's stability test, and the avatar turns take seconds each).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from perf.analyzer import PerfAnalyzerError, SweepPoint, input_data_file, sweep
from perf.inputs import SAMPLES, STREAMING

log = logging.getLogger(__name__)

MODELS = ("vad", "asr", "tts", "llm", "renderer", "avatar_say", "avatar")
CONCURRENCY: dict[str, tuple[int, ...]] = {"avatar": (1, 2, 4)}
DEFAULT_CONCURRENCY = (1, 2, 4, 8)
# requests per concurrency level (at least 2 per client): seconds per level on 2 cores
REQUESTS = {
    "vad": 400,
    "asr": 8,
    "tts": 12,
    "llm": 8,
    "renderer": 32,
    "avatar_say": 8,
    "avatar": 4,
}


def run(
    url: str,
    models: Sequence[str],
    concurrency: Sequence[int] | None,
    requests: int | None,
    workdir: Path,
) -> tuple[list[SweepPoint], list[str]]:
    """(points, failures): a level perf_analyzer could not finish (e.g. requests refused by
    a queue policy on a loaded machine) is reported, and the suite goes on."""
    points: list[SweepPoint] = []
    failures: list[str] = []
    for model in models:
        data = input_data_file(SAMPLES[model](), workdir, f"{model}.json")
        levels = concurrency or CONCURRENCY.get(model, DEFAULT_CONCURRENCY)
        streaming = model in STREAMING
        for level in [0, *levels]:  # 0: two warm-up requests (first ORT runs, caches)
            try:
                got = sweep(
                    url,
                    model,
                    [max(1, level)],
                    data,
                    streaming=streaming,
                    request_count=2 if level == 0 else requests or REQUESTS[model],
                )
            except PerfAnalyzerError as error:
                reason = str(error).strip().splitlines()[-1]
                where = f"concurrency {level}" if level else "warm-up"
                failures.append(f"{model} {where}: {reason}")
                log.warning("suite: %s", failures[-1])
                continue
            if level:
                points += got
        log.info("suite: %s done", model)
    return points, failures


def format_table(points: Sequence[SweepPoint], failures: Sequence[str] = ()) -> str:
    lines = [
        "| model | concurrency | infer/s (c/mean) | infer/s (PA) | p50 ms | p95 ms | p99 ms "
        "| queue ms | compute ms | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.model} | {p.concurrency} | {p.served_per_s:.2f} | {p.throughput_per_s:.2f} | "
            f"{p.p50_ms:.1f} | "
            f"{p.p95_ms:.1f} | {p.p99_ms:.1f} | {p.server_queue_ms:.1f} | "
            f"{p.server_compute_ms:.1f} | {p.load_1m:.2f} |"
        )
    if failures:
        lines += ["", "Not measured:", *(f"- {f}" for f in failures)]
    return "\n".join(lines)


def save(points: Sequence[SweepPoint], failures: Sequence[str], out: Path) -> list[Path]:
    """suite.csv/.json/.md, one throughput-latency PNG per model and one with all."""
    from evals.report import plot_throughput_latency, write_rows

    out = Path(out)
    meta = {"failures": list(failures)}
    paths = [write_rows(points, out / "suite", meta), out / "suite.json", out / "suite.md"]
    (out / "suite.md").write_text(format_table(points, failures) + "\n")
    series: dict[str, list[tuple[str, float, float]]] = {}
    for p in points:
        series.setdefault(p.model, []).append((f"c{p.concurrency}", p.served_per_s, p.p95_ms))
    for model, points_of in series.items():
        paths.append(
            plot_throughput_latency(
                {model: points_of}, out / f"suite-{model}.png", f"{model}: throughput vs latency"
            )
        )
    paths.append(
        plot_throughput_latency(
            series, out / "suite.png", "all models (c = concurrency)", log_x=True
        )
    )
    return paths
