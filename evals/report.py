"""Saving results: CSV + JSON rows, markdown tables, PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "build" / "perf"


def machine() -> dict[str, Any]:
    """What the figures were measured on, with the load: other jobs share these cores."""
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "load_1m_5m_15m": [round(x, 2) for x in load],
    }


def write_rows(rows: Sequence[Any], path: Path, meta: dict[str, Any] | None = None) -> Path:
    """Dataclass rows -> `path`.csv and `path`.json (rows + machine + meta). Returns the CSV."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dicts = [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in rows]
    fields = list(dicts[0]) if dicts else []
    csv_path = path.with_suffix(".csv")
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(dicts)
    blob = {"machine": machine(), **(meta or {}), "rows": dicts}
    path.with_suffix(".json").write_text(json.dumps(blob, indent=1))
    return csv_path


def tables_per_set(
    sets: dict[str, dict[str, Any]],
    columns: Sequence[str],
    cells: Callable[[str, dict[str, Any], dict[str, Any]], Sequence[str]],
) -> str:
    """One markdown table per clip set ({name: {"clips", "seconds", "settings": {key:
    row}}}): a line naming the set, then a row per setting, `cells(key, row, data)`."""
    lines = []
    for name, data in sets.items():
        seconds = data["seconds"]
        lines += [
            f"**{name}**: {data['clips']} clips, {min(seconds):.1f}-{max(seconds):.1f} s",
            "",
            "| " + " | ".join(columns) + " |",
            "|---|" + "---:|" * (len(columns) - 1),
        ]
        for key, row in data["settings"].items():
            lines.append("| " + " | ".join(cells(key, row, data)) + " |")
        lines.append("")
    return "\n".join(lines)


def save_results(out: Path, name: str, results: Any, table: str) -> None:
    """`name`.json (the results) and `name`.md (the table) under `out`; the table printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    (out / f"{name}.md").write_text(table + "\n")
    print(table)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_throughput_latency(
    series: dict[str, Sequence[tuple[str, float, float]]],
    path: Path,
    title: str,
    log_x: bool = False,
) -> Path:
    """One line per series of (label, throughput/s, p95 ms) points, each annotated with its
    label (e.g. "c4": concurrency 4); throughput on x, latency on y (log), as Triton's
    model analyzer draws it."""
    plt = _pyplot()
    fig, axes = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        xs = [p[1] for p in points]
        ys = [p[2] for p in points]
        axes.plot(xs, ys, marker="o", label=name)
        for label, x, y in points:
            axes.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes.set_xlabel("throughput (inferences / s)")
    axes.set_ylabel("p95 latency (ms)")
    axes.set_yscale("log")
    if log_x:
        axes.set_xscale("log")
    axes.grid(True, which="both", alpha=0.3)
    return _save(plt, fig, axes, title, path)


def plot_bars(groups: dict[str, dict[str, float]], path: Path, title: str, ylabel: str) -> Path:
    """Grouped bars: groups (x) -> {series: value}."""
    plt = _pyplot()
    names = list(groups)
    series = sorted({s for g in groups.values() for s in g})
    width = 0.8 / max(1, len(series))
    fig, axes = plt.subplots(figsize=(7, 4.5))
    for i, s in enumerate(series):
        xs = [j + i * width for j in range(len(names))]
        axes.bar(xs, [groups[n].get(s, 0.0) for n in names], width, label=s)
    axes.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(names))], names)
    axes.set_ylabel(ylabel)
    axes.grid(True, axis="y", alpha=0.3)
    return _save(plt, fig, axes, title, path)


def _save(plt, fig, axes, title: str, path: Path) -> Path:
    """Title, legend and layout, then write the PNG and free the figure."""
    axes.set_title(title)
    axes.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
