"""Batching sweep: max_batch_size x max_queue_delay x instance count per model.

For every point the model's materialised (embedded) config is rewritten, a fresh embedded
server is started with only that model, a short warm-up runs, and perf_analyzer measures a
fixed number of requests at a fixed concurrency with realistic inputs (perf/inputs.py).
Fixed request counts, not "until stable" windows: on a shared 2-core machine stability is
never reached, and the sweep must finish in minutes. Results: one CSV/JSON row per point
with p50/p95/p99 latency, throughput, queue and compute time and the machine's load.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import text_format

from perf.analyzer import SweepPoint, input_data_file, sweep
from perf.harness import serve

log = logging.getLogger(__name__)

DELAYS_US = (0, 2000, 10000)
INSTANCES = (1, 2)


@dataclasses.dataclass(frozen=True)
class ModelGrid:
    """What to sweep for one model: batch sizes, the clients' concurrency, requests/point."""

    batches: tuple[int, ...]
    concurrency: int
    requests: int


# Per model: concurrency at least the largest batch (or batches cannot fill); request
# counts sized so that one point takes seconds, not minutes, on one CPU core (asr_encoder
# costs ~1.3 s per 30-s window).
GRIDS: dict[str, ModelGrid] = {
    "tts_vits": ModelGrid((1, 4, 8), 8, 24),
    "asr_encoder": ModelGrid((1, 4, 8), 8, 16),
    "renderer": ModelGrid((1, 4, 8, 16), 16, 48),
    "portrait_renderer": ModelGrid((1, 4, 8, 16), 16, 64),
    "vad": ModelGrid((1, 8, 64), 8, 400),
}
# the default. Not llm_decoder and asr_decoder: sequence models (their caches are implicit
# state), whose steps perf_analyzer cannot replay from recorded tensors; python -m perf
# llm-server and asr-server measure them through the `llm` and `asr` models instead.
SWEPT = ("tts_vits", "asr_encoder", "renderer", "portrait_renderer")


@dataclasses.dataclass(frozen=True)
class BatchPoint:
    max_batch_size: int
    delay_us: int
    instances: int

    @property
    def label(self) -> str:
        return f"b{self.max_batch_size}-d{self.delay_us}-i{self.instances}"


@dataclasses.dataclass(frozen=True)
class BatchResult:
    model: str
    max_batch_size: int
    delay_us: int
    instances: int
    concurrency: int
    requests: int
    throughput_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float
    server_queue_ms: float
    server_compute_ms: float
    load_1m: float

    @staticmethod
    def fields() -> list[str]:
        return [f.name for f in dataclasses.fields(BatchResult)]

    @property
    def served_per_s(self) -> float:
        """Throughput by Little's law, concurrency / mean latency: perf_analyzer's count
        mode divides by whole seconds (48 requests in 5 or 6 s: 9.6 or 8.0/s), too coarse."""
        return self.concurrency / (self.avg_ms / 1000) if self.avg_ms else 0.0

    @classmethod
    def of(cls, point: BatchPoint, swept: SweepPoint, requests: int) -> BatchResult:
        return cls(
            model=swept.model,
            max_batch_size=point.max_batch_size,
            delay_us=point.delay_us,
            instances=point.instances,
            concurrency=swept.concurrency,
            requests=requests,
            throughput_per_s=swept.throughput_per_s,
            p50_ms=swept.p50_ms,
            p95_ms=swept.p95_ms,
            p99_ms=swept.p99_ms,
            avg_ms=swept.avg_ms,
            server_queue_ms=swept.server_queue_ms,
            server_compute_ms=swept.server_compute_ms,
            load_1m=round(swept.load_1m, 2),
        )


def grid_points(
    batches: Sequence[int], delays_us: Sequence[int], instances: Sequence[int]
) -> list[BatchPoint]:
    """The grid; max_batch_size 1 is measured once per instance count (no delay can help)."""
    points = []
    for count, batch, delay in itertools.product(instances, batches, delays_us):
        if batch == 1 and delay != min(delays_us):
            continue
        points.append(BatchPoint(batch, delay, count))
    return points


def rewrite_config(point: BatchPoint, model: str, repository: Path) -> None:
    """Set max_batch_size, the dynamic batcher's delay and the instance count in place."""
    from model_configs.pbtxt import parse_config

    path = repository / model / "config.pbtxt"
    config = parse_config(path)
    if config.max_batch_size <= 0:
        raise ValueError(f"{path}: model does not batch (max_batch_size 0); cannot sweep it")
    config.max_batch_size = point.max_batch_size
    config.dynamic_batching.max_queue_delay_microseconds = point.delay_us
    del config.dynamic_batching.preferred_batch_size[:]  # let the size alone decide
    if not config.instance_group:
        config.instance_group.add()
    for group in config.instance_group:
        group.count = point.instances
    header = f"# perf batching sweep point {point.label}\n"
    path.write_text(header + text_format.MessageToString(config))


def sweep_model(
    model: str,
    points: Sequence[BatchPoint],
    grid: ModelGrid,
    workdir: Path,
) -> list[BatchResult]:
    """Every point of one model, each on a freshly started server with its config."""
    from perf.inputs import SAMPLES

    data = input_data_file(SAMPLES[model](), workdir / model)
    results = []
    for point in points:
        log.info("%s %s: starting server (load %.2f)", model, point.label, os.getloadavg()[0])
        configure = functools.partial(rewrite_config, point, model)
        with serve(models=[model], configure=configure) as target:
            warm = point.instances * 2  # first ORT runs allocate; keep them out of the figures
            sweep(target.grpc_url, model, [point.instances], data, request_count=warm)
            (swept,) = sweep(
                target.grpc_url, model, [grid.concurrency], data, request_count=grid.requests
            )
        result = BatchResult.of(point, swept, max(grid.requests, 2 * grid.concurrency))
        log.info(
            "%s %s: %.1f infer/s, p50 %.1f ms, p99 %.1f ms",
            model,
            point.label,
            result.throughput_per_s,
            result.p50_ms,
            result.p99_ms,
        )
        results.append(result)
    return results


def run(
    models: Sequence[str],
    *,
    delays_us: Sequence[int] = DELAYS_US,
    instances: Sequence[int] = INSTANCES,
    batches: Sequence[int] | None = None,
    concurrency: int | None = None,
    requests: int | None = None,
) -> list[BatchResult]:
    """The sweep of each model (its GRIDS entry, overridden by the given values)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="perf-batching-") as tmp:
        for model in models:
            base = GRIDS[model]
            grid = ModelGrid(
                tuple(batches or base.batches),
                concurrency or base.concurrency,
                requests or base.requests,
            )
            points = grid_points(grid.batches, delays_us, instances)
            results += sweep_model(model, points, grid, Path(tmp))
    return results


def best(results: Sequence[BatchResult], model: str) -> BatchResult:
    """The point with the highest throughput (concurrency / mean latency)."""
    rows = [r for r in results if r.model == model]
    return max(rows, key=lambda r: r.served_per_s)


def format_table(results: Sequence[BatchResult]) -> str:
    """Markdown table, one row per point."""
    lines = [
        "| model | max batch | delay ms | instances | conc | infer/s (c/mean) | infer/s (PA) | "
        "p50 ms | p95 ms | p99 ms | queue ms | compute ms | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.model} | {r.max_batch_size} | {r.delay_us / 1000:g} | {r.instances} | "
            f"{r.concurrency} | {r.served_per_s:.2f} | {r.throughput_per_s:.1f} | "
            f"{r.p50_ms:.1f} | {r.p95_ms:.1f} | "
            f"{r.p99_ms:.1f} | {r.server_queue_ms:.1f} | {r.server_compute_ms:.1f} | "
            f"{r.load_1m:.2f} |"
        )
    return "\n".join(lines)


def load(path: Path) -> list[BatchResult]:
    """Rows of a saved batching.json (to re-tabulate or merge runs)."""
    import json

    rows = json.loads(Path(path).read_text())["rows"]
    return [BatchResult(**{k: row[k] for k in BatchResult.fields()}) for row in rows]


def plot(results: Sequence[BatchResult], folder: Path) -> list[Path]:
    """Per model: throughput vs p95, one line per (instances, delay), points = batch sizes."""
    from evals.report import plot_throughput_latency

    paths = []
    for model in dict.fromkeys(r.model for r in results):
        series: dict[str, list[tuple[str, float, float]]] = {}
        for r in results:
            if r.model == model:
                key = f"{r.instances} inst, delay {r.delay_us / 1000:g} ms"
                series.setdefault(key, []).append(
                    (f"b{r.max_batch_size}", r.served_per_s, r.p95_ms)
                )
        title = f"{model}: batching sweep (points: max_batch_size)"
        paths.append(plot_throughput_latency(series, folder / f"batching-{model}.png", title))
    return paths
