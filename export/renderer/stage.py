"""The renderer stage's declaration: the cartoon face renderer (export/renderer/recipe.py)."""

from __future__ import annotations

import dataclasses

from export.common import Tolerance
from export.stage import ExportStage
from export.tensorrt.engine import ShapeProfile
from export.tensorrt.spec import Stage as EngineStage
from export.tensorrt.spec import uniform


@dataclasses.dataclass(frozen=True)
class RendererProfile(ShapeProfile):
    batch: tuple[int, int, int] = (1, 8, 16)  # config max_batch_size 16, preferred 8 / 16


# Engine tolerances are stated, not measured: no engine has been built on the project
# machines (no TensorRT); tighten them from the first verification record on a GPU host.
STAGES = (
    ExportStage(
        "renderer",
        "export.renderer.recipe:RendererRecipe",
        build_s=2.8,
        engine=EngineStage(
            "export.renderer.stage:RendererProfile",
            ("fp32",),
            "fp32",
            {},
            fp32={"frames": Tolerance(atol=2.0)},  # the export's own tolerance (uint8 levels)
            inputs={"blendshapes": uniform(0.0, 1.0), "head_pose": uniform(-0.3, 0.3)},
            why="FP32 only: FP16 coordinates (~0.1 px at 256 px) move anti-aliased edge pixels by "
            "tens of levels; the renderer is cheap at FP32",
        ),
    ),
)
