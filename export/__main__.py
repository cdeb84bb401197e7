"""`python -m export build [MODEL ...]`: build every model's verified artifacts (cached)."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from export.common import cache_root
from export.registry import RECIPES, ensure_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build artifacts (skips those already cached)")
    build.add_argument("models", nargs="*", help=f"default: all of {sorted(RECIPES)}")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    sub.add_parser("list", help="list the known recipes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("export")

    if args.command == "list":
        for name, target in sorted(RECIPES.items()):
            sys.stdout.write(f"{name}\t{target}\n")
        return 0
    unknown = sorted(set(args.models) - set(RECIPES))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {sorted(RECIPES)}")
    started = time.monotonic()
    folders = ensure_all(args.models or None, force=args.force)
    for name, folder in folders.items():
        log.info("%-14s %s", name, folder)
    log.info(
        "%d artifacts ready under %s in %.1f s",
        len(folders),
        cache_root(),
        time.monotonic() - started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
