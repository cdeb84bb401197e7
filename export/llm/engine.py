"""TensorRT engine recipe for `llm_decoder` (production target): a `trtexec` command line.

Profiles come from the export's sidecar (its named dynamic axes) and the serving limits of
the `llm` BLS: up to 8 rows per step, prompts up to the context budget in one prefill, a
past from 0 (first step) to the context. The command builder is the shared one of
export/tensorrt/engine.py; the build runs where `trtexec` exists (NGC containers).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from avatar.llm.engine import EngineConfig
from export.tensorrt import engine
from export.tensorrt.engine import Range, ShapeProfile

CONTEXT = EngineConfig.context_tokens  # 1024


@dataclasses.dataclass(frozen=True)
class DecoderProfile(ShapeProfile):
    """min/opt/max per dynamic axis name of the decoder's sidecar."""

    batch: Range = (1, 4, 8)
    sequence: Range = (1, 1, CONTEXT)  # decode steps dominate: opt 1
    past_sequence: Range = (0, 256, CONTEXT)
    total_sequence: Range = (1, 257, CONTEXT)


def build_engine(artifact: Path, precision: str = "fp16") -> Path:
    """`artifact/model.onnx` -> `artifact/model.plan` (needs TensorRT)."""
    return engine.build_engine(artifact, DecoderProfile(), precision)
