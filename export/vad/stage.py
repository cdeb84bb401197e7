"""The VAD stage's declaration: Silero VAD (export/vad/recipe.py)."""

from __future__ import annotations

import dataclasses

from export.common import Tolerance
from export.stage import ExportStage
from export.tensorrt.engine import ShapeProfile
from export.tensorrt.spec import Stage as EngineStage


@dataclasses.dataclass(frozen=True)
class VadProfile(ShapeProfile):
    batch: tuple[int, int, int] = (1, 16, 64)  # config max_batch_size 64


# Engine tolerances are stated, not measured: no engine has been built on the project
# machines (no TensorRT); tighten them from the first verification record on a GPU host.
STAGES = (
    ExportStage(
        "vad",
        "export.vad.recipe:VadRecipe",
        build_s=0.1,
        engine=EngineStage(
            "export.vad.stage:VadProfile",
            ("fp32", "fp16"),
            "fp16",
            {"speech_prob": Tolerance(0.01), "next_*": Tolerance(0.01, 0.01)},
            why="served by ONNX Runtime on CPU in production (see its config); engine on request",
        ),
    ),
)
