"""Figures for the LLM stage, printed (not asserted): `python -m export.llm --report`. Decode
step time per variant and batch size, greedy agreement of the variants (from the artifact's
validation record, which the export passes), and time to first token with/without the prefix
cache and tokens/s at 1/4/8 streams (evals.llm_generation)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from avatar.llm.decoder import OrtDecoder
from evals.llm_decoding import step_ms

log = logging.getLogger(__name__)

BATCHES = (1, 4, 8)


def report(folder: Path, validation: dict[str, Any], threads: int = 1) -> None:
    """Print the figures of the artifact in `folder` whose sidecar's validation record is
    `validation` (single-threaded ORT unless told)."""
    print(f"artifact {folder}")
    print(f"step check vs PyTorch: {json.dumps(validation['step'])}")
    for label, record in validation["greedy_vs_pytorch"].items():
        print(f"fp32 greedy vs PyTorch {label}: {record}")
    for name, record in validation.get("variants", {}).items():
        why = record.get("gate") or record["why"]
        print(f"{name} vs fp32 (gate passed: {record['passes_gate']}; {why}):")
        for key in ("batch1", "batch5_left_padded", "rows_independent"):
            print(f"  {key}: {record[key]}")
    print(f"default variant: {validation['default_variant']}")
    print(f"ms per decode step (past 64, {threads} ORT thread):")
    for name in ("model.onnx", *validation.get("variants", {})):
        decoder = OrtDecoder(folder / name, threads=threads)
        figures = {b: step_ms(decoder, b) for b in BATCHES}
        cells = "  ".join(
            f"batch {b}: {ms:6.1f} ms ({b * 1000 / ms:5.0f} tok/s)" for b, ms in figures.items()
        )
        print(f"  {name:18s} {cells}")
    from evals.llm_generation import print_generation_figures

    print_generation_figures(folder, threads=threads)
