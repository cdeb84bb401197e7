"""The turn detector stage's declaration: Smart Turn, the audio's end of turn."""

from __future__ import annotations

import dataclasses

from export.common import Tolerance
from export.stage import ExportStage
from export.tensorrt.engine import ShapeProfile
from export.tensorrt.spec import Stage as EngineStage
from export.tensorrt.spec import uniform


@dataclasses.dataclass(frozen=True)
class TurnDetectorProfile(ShapeProfile):
    batch: tuple[int, int, int] = (1, 8, 32)  # config max_batch_size 32


# Engine tolerances are stated, not measured: no engine has been built on the project
# machines (no TensorRT); tighten them from the first verification record on a GPU host.
STAGES = (
    ExportStage(
        "turn_detector",
        "export.turn_detector.recipe:TurnDetectorRecipe",
        build_s=2.1,
        engine=EngineStage(
            "export.turn_detector.stage:TurnDetectorProfile",
            ("fp16",),
            "fp16",
            {"probability": Tolerance(0.05)},
            inputs={"input_features": uniform(-1.0, 1.5)},  # the log-mel's range
            why="the graph is its authors' INT8 Q/DQ: those layers run INT8 (explicit "
            "quantisation), the rest FP16; no other precision to choose",
        ),
    ),
)
