"""`python -m perf gpu-stages` (and `python -m perf.gpu_stages`): its flags, the device,
and the report of each job (the networks alone, the served chain, the sessions sweep)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from perf.gpu_stages import sessions
from perf.gpu_stages.served import ROOT, served
from perf.gpu_stages.timing import in_process

log = logging.getLogger(__name__)

OUT = ROOT / "build/perf/gpu_stages/stages.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The per-stage flags and the sweep's (`--sessions` selects the sweep)."""
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--skip-served", action="store_true", help="the networks alone only")
    parser.add_argument(
        "--graphs", action="store_true", help="also each network replayed as a CUDA graph"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"the figures as JSON ({OUT}; --sessions: {sessions.OUT.name})",
    )
    parser.add_argument(
        "--sessions", type=int, nargs="+", default=[], help="concurrent paced sessions, per level"
    )
    parser.add_argument("--level-s", type=float, default=20.0, help="each level's duration")
    parser.add_argument("--pause-s", type=float, default=4.0, help="a session's pause per turn")
    parser.add_argument("--instances", type=int, default=1, help="instances per stage model")
    parser.add_argument(
        "--stop-p95-s",
        type=float,
        default=2 * sessions.LIMIT_MS / 1000,
        help="stop above this p95",
    )
    parser.set_defaults(func=command)


def device_report(device: str) -> dict[str, Any] | None:
    """What the run is on (torch, the GPU's name); None when CUDA is asked for and absent."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        log.error("gpu-stages: torch sees no CUDA device (--device cpu checks the code path)")
        return None
    report: dict[str, Any] = {"device": device, "torch": torch.__version__}
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
    return report


def command(args: argparse.Namespace) -> int:
    report = device_report(args.device)
    if report is None:
        return 2
    return sweep(args, report) if args.sessions else stages(args, report)


def stages(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """Each network alone, then (unless --skip-served) the served chain."""
    report["in_process"] = in_process(args.device, args.reps, tuple(args.batches), args.graphs)
    print(json.dumps({"in_process": report["in_process"]}, indent=1), flush=True)
    if not args.skip_served:
        try:
            report["served"] = served(args.device, args.reps)
        except Exception as exc:  # the networks' figures above still stand
            log.exception("the served chain failed")
            report["served"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"served": report["served"]}, indent=1), flush=True)
    _write(args.out or OUT, report)
    return 0 if "error" not in report.get("served", {}) else 1


def sweep(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """The sessions sweep (perf.gpu_stages.sessions) and its table."""
    report["capacity"] = sessions.sweep(
        args.device,
        args.sessions,
        args.level_s,
        args.pause_s,
        instances=args.instances,
        stop_p95_ms=args.stop_p95_s * 1000,
    )
    for line in sessions.format_table(report["capacity"]["levels"]):
        print(line)
    _write(args.out or sessions.OUT, report)
    return 0 if all(not row["errors"] for row in report["capacity"]["levels"]) else 1


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="each stage on a GPU, alone and served")
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
