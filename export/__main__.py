"""`python -m export build [MODEL ...]`: build every model's verified artifacts (cached).
`python -m export engines [MODEL ...]`: TensorRT engines of the tensorrt_plan models,
verified against ONNX Runtime, and the production repository (needs TensorRT + a GPU).
`python -m export portrait PHOTO`: rig a frontal photo as the avatar's portrait
(`python -m export.portrait --help` for its options)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from export.common import cache_root
from export.registry import RECIPES, ensure_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build artifacts (skips those already cached)")
    build.add_argument("models", nargs="*", help=f"default: all of {sorted(RECIPES)}")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.add_argument(
        "--variants",
        action="store_true",
        help="also the precision variants (ASR INT8/FP16, LLM int4) for reports and engines",
    )
    sub.add_parser("list", help="list the known recipes")
    engines = sub.add_parser(
        "engines", help="TensorRT engines (verified) + production repository; needs TensorRT"
    )
    engines.add_argument("models", nargs="*", help="default: every tensorrt_plan model")
    engines.add_argument(
        "--precision",
        choices=("auto", "fp32", "fp16", "int8"),
        default="auto",
        help="auto: FP16 (or the stage's default), INT8 only where a Q/DQ variant passed its gate",
    )
    engines.add_argument("--force", action="store_true", help="rebuild even if verified")
    engines.add_argument(
        "--out",
        type=Path,
        default=Path("build/repository-production"),
        help="production repository to write (default build/repository-production)",
    )
    engines.add_argument("--no-repository", action="store_true", help="engines only")
    portrait = sub.add_parser(
        "portrait", help="rig a frontal photo as the portrait (python -m export.portrait -h)"
    )
    portrait.add_argument("options", nargs=argparse.REMAINDER, help="PHOTO [--report] ...")
    args = parser.parse_args(argv)
    if args.command == "portrait":
        from export.portrait.recipe import main as portrait_main

        portrait_main(args.options)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("export")

    if args.command == "list":
        for name, target in sorted(RECIPES.items()):
            sys.stdout.write(f"{name}\t{target}\n")
        return 0
    if args.command == "engines":
        return _engines(args, log)
    unknown = sorted(set(args.models) - set(RECIPES))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {sorted(RECIPES)}")
    started = time.monotonic()
    folders = ensure_all(args.models or None, force=args.force, variants=args.variants)
    for name, folder in folders.items():
        log.info("%-14s %s", name, folder)
    log.info(
        "%d artifacts ready under %s in %.1f s",
        len(folders),
        cache_root(),
        time.monotonic() - started,
    )
    return 0


def _engines(args: argparse.Namespace, log: logging.Logger) -> int:
    from export.tensorrt.build import EngineVerificationError, build_all
    from export.tensorrt.engine import TensorRTMissingError
    from serving.deployment import SOURCE_REPOSITORY

    try:
        records = build_all(
            SOURCE_REPOSITORY,
            None if args.no_repository else args.out,
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
    if not args.no_repository:
        log.info("production repository written to %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
