"""perf_analyzer from the `tritonclient` wheel: locate it, give it its libraries, run it.

The manylinux wheel of tritonclient 2.50 ships `perf_analyzer` in the environment's
bin/; it links against `libcudart.so.12` (from the `nvidia-cuda-runtime-cu12` wheel, no
GPU needed) and Debian's `libb64-0d` (scripts/setup.sh installs it).
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

B64_ABOVE = 4096  # elements: larger tensors go into the JSON as base64 (smaller, faster)


class PerfAnalyzerError(RuntimeError):
    pass


def binary() -> Path:
    candidate = Path(sys.executable).parent / "perf_analyzer"
    found = candidate if candidate.is_file() else shutil.which("perf_analyzer")
    if not found:
        raise PerfAnalyzerError("perf_analyzer not found: run scripts/setup.sh (tritonclient 2.50)")
    return Path(found)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    if spec is None or not spec.submodule_search_locations:
        raise PerfAnalyzerError(
            "nvidia-cuda-runtime-cu12 is not installed (perf_analyzer needs libcudart.so.12)"
        )
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
    return env


def _entry(array: np.ndarray) -> dict:
    """One input of one sample: strings as text, big tensors as base64 of their bytes."""
    a = np.asarray(array)
    if a.dtype == object or a.dtype.kind in "SU":
        items = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in a.reshape(-1)]
        return {"content": items, "shape": list(a.shape)}
    if a.size > B64_ABOVE:
        raw = np.ascontiguousarray(a).tobytes()
        return {"b64": base64.b64encode(raw).decode("ascii"), "shape": list(a.shape)}
    return {"content": a.reshape(-1).tolist(), "shape": list(a.shape)}


def input_data_file(
    samples: Sequence[Mapping[str, np.ndarray]], folder: Path, name: str = "input_data.json"
) -> Path:
    """perf_analyzer's --input-data JSON: one entry per sample, shapes without the batch."""
    data = [{k: _entry(a) for k, a in sample.items()} for sample in samples]
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": data}))
    return path


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    model: str
    concurrency: int
    throughput_per_s: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float
    server_queue_ms: float
    server_compute_ms: float
    load_1m: float = 0.0  # os.getloadavg() when the point was measured (shared machines)

    @staticmethod
    def fields() -> list[str]:
        return [f.name for f in dataclasses.fields(SweepPoint)]

    @property
    def served_per_s(self) -> float:
        """Throughput by Little's law, concurrency / mean latency: in --request-count mode
        perf_analyzer divides by whole seconds, too coarse for slow models."""
        return self.concurrency / (self.avg_ms / 1000) if self.avg_ms else 0.0


def _parse_csv(path: Path, model: str) -> list[SweepPoint]:
    rows = list(csv.DictReader(path.open()))
    points = []
    for row in rows:
        us = {k: float(v) for k, v in row.items() if k != "Concurrency" and v not in ("", None)}
        points.append(
            SweepPoint(
                model=model,
                concurrency=int(row["Concurrency"]),
                throughput_per_s=us["Inferences/Second"],
                p50_ms=us["p50 latency"] / 1000,
                p90_ms=us["p90 latency"] / 1000,
                p95_ms=us["p95 latency"] / 1000,
                p99_ms=us["p99 latency"] / 1000,
                avg_ms=(
                    us["Client Send"]
                    + us["Network+Server Send/Recv"]
                    + us["Server Queue"]
                    + us["Server Compute Input"]
                    + us["Server Compute Infer"]
                    + us["Server Compute Output"]
                    + us["Client Recv"]
                )
                / 1000,
                server_queue_ms=us["Server Queue"] / 1000,
                server_compute_ms=(
                    us["Server Compute Input"]
                    + us["Server Compute Infer"]
                    + us["Server Compute Output"]
                )
                / 1000,
            )
        )
    return points


def sweep(  # noqa: PLR0917 - mirrors perf_analyzer's own flags
    url: str,
    model: str,
    concurrency: Sequence[int],
    input_data: Path | None = None,
    measurement_ms: int = 3000,
    streaming: bool = False,
    extra_args: Sequence[str] = (),
    stability_percent: float = 10.0,
    request_count: int = 0,
) -> list[SweepPoint]:
    """One perf_analyzer run per concurrency level over gRPC; returns the parsed points.

    request_count > 0: measure exactly that many requests (at least 2 per concurrent
    client) in one window instead of time windows until stable: predictable run times
    for slow models."""
    points = []
    with tempfile.TemporaryDirectory(prefix="perf-") as tmp:
        for level in concurrency:
            report = Path(tmp) / f"c{level}.csv"
            cmd = [
                str(binary()),
                "-m",
                model,
                "-u",
                url,
                "-i",
                "grpc",
                f"--concurrency-range={level}:{level}",
                "--percentile=95",
                "-f",
                str(report),
                *extra_args,
            ]
            if request_count > 0:
                cmd.append(f"--request-count={max(request_count, 2 * level)}")
            else:
                cmd += [
                    f"--measurement-interval={measurement_ms}",
                    # perf_analyzer's own default is 10 %; shared machines need a looser one.
                    f"--stability-percentage={stability_percent:g}",
                ]
            if input_data:
                cmd.append(f"--input-data={input_data}")
            if streaming:
                cmd.append("--streaming")
            log.info("perf_analyzer: %s concurrency %d", model, level)
            done = subprocess.run(
                cmd, env=environment(), capture_output=True, text=True, check=False
            )
            if done.returncode != 0 or not report.is_file():
                raise PerfAnalyzerError(
                    f"perf_analyzer failed ({done.returncode}) for {model} at concurrency "
                    f"{level}:\n{(done.stdout + done.stderr)[-3000:]}"
                )
            load = os.getloadavg()[0]
            points += [dataclasses.replace(p, load_1m=load) for p in _parse_csv(report, model)]
    return points


def write_csv(points: Sequence[SweepPoint], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(SweepPoint.fields())
        for p in points:
            writer.writerow([getattr(p, f) for f in SweepPoint.fields()])
    return path


def format_table(points: Sequence[SweepPoint]) -> str:
    head = (
        f"{'model':<10} {'conc':>4} {'infer/s':>9} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'queue ms':>9} {'compute ms':>10}"
    )
    lines = [head, "-" * len(head)]
    for p in points:
        lines.append(
            f"{p.model:<10} {p.concurrency:>4} {p.throughput_per_s:>9.1f} {p.p50_ms:>8.2f} "
            f"{p.p95_ms:>8.2f} {p.p99_ms:>8.2f} {p.server_queue_ms:>9.2f} "
            f"{p.server_compute_ms:>10.2f}"
        )
    return "\n".join(lines)
