"""`python -m export.tts [--report]`: build (or find cached) `tts_vits`; the report measures
size, real-time factor and word error rate of the FP32 / FP16 / INT8 variants.

The command lives here, not in recipe.py: the report's FP16 graph is a variant recipe,
which imports the recipe. The measuring is evals.tts's (its real-time factor is the
INT8 gate's too).
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
        report_variants(folder, args.sentences)
    return 0


def report_variants(fp32_folder: Path, sentences: int) -> dict[str, dict]:
    """evals.tts's figures of the FP32 graph, the FP16 variant (built here when it
    builds) and the INT8 variant built and gated with the export."""
    from evals.tts import report
    from export.asr.weights import packaged_ct2_dir
    from export.common import onnx_session
    from export.tts.int8 import VARIANT_FILE
    from export.tts.variants import VitsVariantRecipe

    paths = {"fp32": fp32_folder / "model.onnx"}
    try:
        paths["fp16"] = ensure(VitsVariantRecipe("fp16")) / "model.onnx"
    except Exception as error:  # reported, not fatal: the default is FP32
        log.error("fp16 variant failed to build: %s", error)
    paths["int8"] = fp32_folder / VARIANT_FILE
    return report(paths, packaged_ct2_dir(), onnx_session, sentences)


if __name__ == "__main__":
    raise SystemExit(main())
