"""`python -m export build [MODEL ...]`: build every model's verified artifacts (cached).
`python -m export gates [MODEL ...] [--record]`: run every INT8 gate not yet run on this
machine and check the build's verdicts (export/gates.py).
`python -m export engines [MODEL ...]`: TensorRT engines of the tensorrt_plan models,
verified against ONNX Runtime (needs TensorRT + a GPU); `avatar materialize --target
production` then writes the production repository.
`python -m export portrait PHOTO`: rig a frontal photo as the avatar's portrait
(`python -m export.portrait --help` for its options)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from export.common import cache_root, worker_logging
from export.registry import GATES, RECIPES, ensure_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build artifacts (skips those already cached)")
    build.add_argument("models", nargs="*", help=f"default: all of {sorted(RECIPES)}")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.add_argument(
        "--jobs", type=int, default=1, help="build up to this many models at once (processes)"
    )
    build.add_argument(
        "--variants",
        action="store_true",
        help="also the precision variants (ASR INT8/FP16, LLM int4) for reports and engines",
    )
    gates = sub.add_parser(
        "gates",
        help="run the INT8 gates (once per variant and machine); fail where a verdict differs "
        "from the one the build took",
    )
    gates.add_argument("models", nargs="*", help=f"default: all of {sorted(GATES)}")
    gates.add_argument(
        "--record", action="store_true", help="write the measured verdicts to export/gates.json"
    )
    sub.add_parser("list", help="list the known recipes")
    engines = sub.add_parser(
        "engines", help="TensorRT engines, verified against ONNX Runtime; needs TensorRT"
    )
    engines.add_argument("models", nargs="*", help="default: every tensorrt_plan model")
    engines.add_argument(
        "--precision",
        choices=("auto", "fp32", "fp16", "int8"),
        default="auto",
        help="auto: FP16 (or the stage's default), INT8 only where a Q/DQ variant passed its gate",
    )
    engines.add_argument("--force", action="store_true", help="rebuild even if verified")
    portrait = sub.add_parser(
        "portrait", help="rig a frontal photo as the portrait (python -m export.portrait -h)"
    )
    portrait.add_argument("options", nargs=argparse.REMAINDER, help="PHOTO [--report] ...")
    args = parser.parse_args(argv)
    if args.command == "portrait":
        from export.portrait.recipe import main as portrait_main

        portrait_main(args.options)
        return 0
    worker_logging()
    log = logging.getLogger("export")

    if args.command == "list":
        for name, target in sorted(RECIPES.items()):
            sys.stdout.write(f"{name}\t{target}\n")
        return 0
    if args.command == "engines":
        return _engines(args, log)
    if args.command == "gates":
        return _gates(args, log)
    unknown = sorted(set(args.models) - set(RECIPES))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {sorted(RECIPES)}")
    started = time.monotonic()
    _share_cores(args.jobs)
    folders = ensure_all(
        args.models or None, force=args.force, variants=args.variants, jobs=args.jobs
    )
    for name, folder in folders.items():
        log.info("%-14s %s", name, folder)
    log.info(
        "%d artifacts ready under %s in %.1f s",
        len(folders),
        cache_root(),
        time.monotonic() - started,
    )
    return 0


def _share_cores(processes: int) -> None:
    """Give each of `processes` worker processes its share of the cores (they inherit the
    environment). torch's OpenMP threads spin while they wait: two builds with a thread per
    core each took 742 s for the LLM's greedy check that took 40 s once the other ended."""
    if processes > 1:
        share = max(1, (os.cpu_count() or 1) // processes)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(share))


def _gates(args: argparse.Namespace, log: logging.Logger) -> int:
    """Every gate measured here (kept beside its artifact), compared with the verdict the
    build took (recorded or measured) and with export/gates.json."""
    from export import gates
    from export.quantize import VARIANT_FILE
    from export.sidecar import Sidecar

    names = args.models or sorted(GATES)
    unknown = sorted(set(names) - set(GATES))
    if unknown:
        log.error("no INT8 gate for %s; gated: %s", unknown, sorted(GATES))
        return 2
    started = time.monotonic()
    _share_cores(len(names))
    records = gates.load_records()
    failures = []
    folders = ensure_all(names)
    for name, fresh in gates.measure_all(folders, VARIANT_FILE).items():
        took = Sidecar.load(folders[name]).validation["variants"][VARIANT_FILE]
        verdict = "passes" if fresh["passes_gate"] else "fails"
        sys.stdout.write(f"{name}\t{verdict}\t{fresh['why']}\n")
        if bool(fresh["passes_gate"]) != bool(took["passes_gate"]):
            failures.append(
                f"{name}: the gate {verdict} here, but the build took the {took['verdict']} "
                f"verdict ({took['why']}; measured on {took['measured_on']})"
            )
        recorded = records.get(name)
        if args.record:
            records[name] = gates.as_record(name, fresh)
        elif recorded is None:
            failures.append(f"{name}: no record in {gates.RECORDS.name}: run with --record")
        elif (recorded["sha256"], recorded["gate_code"]) != (fresh["sha256"], fresh["gate_code"]):
            # a changed recipe or gate (record it), or a build not reproducible on this CPU
            log.warning(
                "%s: this variant and gate (sha256 %s, gate %s) are not the recorded ones "
                "(%s, %s): every fresh machine measures its gate; if the code changed, run "
                "with --record",
                name, fresh["sha256"][:12], fresh["gate_code"], recorded["sha256"][:12],
                recorded["gate_code"],
            )  # fmt: skip
    if args.record:
        gates.write_records(records)
        log.info("recorded %d verdicts in %s", len(names), gates.RECORDS)
    log.info("%d gates checked in %.1f s", len(names), time.monotonic() - started)
    for failure in failures:
        log.error("%s", failure)
    return 1 if failures else 0


def _engines(args: argparse.Namespace, log: logging.Logger) -> int:
    from export.tensorrt.build import EngineVerificationError, build_all
    from export.tensorrt.engine import TensorRTMissingError
    from model_configs.pbtxt import SOURCE_REPOSITORY

    try:
        records = build_all(
            SOURCE_REPOSITORY,
            args.models or None,
            requested=args.precision,
            force=args.force,
        )
    except TensorRTMissingError as error:
        log.error("%s", error)
        return 2
    except EngineVerificationError as error:
        log.error("%s", error)
        return 1
    for name, record in records.items():
        worst = {o["name"]: f"{o['max_abs']:.3g}" for o in record.get("outputs", [])}
        sys.stdout.write(f"{name}\t{record['precision']}\tmax abs error {worst}\n")
    log.info("engines verified; the production repository: avatar materialize --target production")
    return 0


if __name__ == "__main__":
    sys.exit(main())
