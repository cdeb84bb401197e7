"""TensorRT engine recipe for `llm_decoder` (production target): a `trtexec` command line.

Profiles come from the export's sidecar (its named dynamic axes) and the serving limits of
the `llm` BLS: up to 8 rows per step, prompts up to the context budget in one prefill, a
past from 0 (first step) to the context. The command builder is the shared one of
export/tts_engine.py; the build runs where `trtexec` exists (NGC containers).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from pathlib import Path

from avatar.llm.engine import EngineConfig
from avatar.sidecar import Sidecar
from export.tts_engine import Profile, trtexec_command

log = logging.getLogger(__name__)

CONTEXT = EngineConfig.context_tokens  # 1024


@dataclasses.dataclass(frozen=True)
class DecoderProfile(Profile):
    """min/opt/max per dynamic axis name of the decoder's sidecar."""

    batch: tuple[int, int, int] = (1, 4, 8)
    sequence: tuple[int, int, int] = (1, 1, CONTEXT)  # decode steps dominate: opt 1
    past_sequence: tuple[int, int, int] = (0, 256, CONTEXT)
    total_sequence: tuple[int, int, int] = (1, 257, CONTEXT)


def build_engine(artifact: Path, precision: str = "fp16") -> Path:
    """Run trtexec on `artifact/model.onnx` -> `artifact/model.plan` (needs TensorRT)."""
    if shutil.which("trtexec") is None:
        raise FileNotFoundError("trtexec not found: build engines where TensorRT is installed")
    engine = artifact / "model.plan"
    sidecar = Sidecar.load(artifact)
    cmd = trtexec_command(artifact / "model.onnx", engine, sidecar, precision, DecoderProfile())
    log.info("building %s: %s", engine, " ".join(cmd))
    subprocess.run(cmd, check=True)
    return engine
