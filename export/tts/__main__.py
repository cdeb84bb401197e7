"""`python -m export.tts [--report]`: build (or find cached) `tts_vits`; the report measures
size, real-time factor and word error rate of the FP32 / FP16 / INT8 variants.

The command lives here, not in recipe.py: the report imports the variants, which import the
recipe, so the recipe must not import the report (the INT8 gate's measures are in
intelligibility.py, which both use).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from export.common import ensure
from export.tts import recipe
from export.tts.recipe import VitsRecipe

log = logging.getLogger("export.tts")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export.tts", description=recipe.__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument(
        "--source", type=Path, help="another Piper voice's .onnx (its .onnx.json beside it)"
    )
    parser.add_argument("--report", action="store_true", help="measure size, RTF and WER")
    parser.add_argument("--sentences", type=int, default=24, help="WER sentences (report)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = ensure(VitsRecipe(args.source), force=args.force)
    log.info("tts_vits: %s", folder)
    if args.report and args.source:
        parser.error("--report measures the packaged English voice only")
    if args.report:
        from export.tts.report import report

        report(folder, sentences=args.sentences)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
