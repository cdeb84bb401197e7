"""The portrait stage's declaration: the photo portrait renderer (export/portrait/recipe.py)."""

from __future__ import annotations

from export.common import Tolerance
from export.stage import ExportStage
from export.tensorrt.spec import Stage as EngineStage
from export.tensorrt.spec import uniform

# Engine tolerances are stated, not measured: no engine has been built on the project
# machines (no TensorRT); tighten them from the first verification record on a GPU host.
STAGES = (
    ExportStage(
        "portrait_renderer",
        "export.portrait.recipe:PortraitRecipe",
        build_s=4.1,
        engine=EngineStage(
            "export.renderer.stage:RendererProfile",
            ("fp32",),
            "fp32",
            {},
            fp32={"frames": Tolerance(atol=3.0)},  # uint8 levels: bilinear taps may round apart
            inputs={"blendshapes": uniform(0.0, 1.0), "head_pose": uniform(-0.1, 0.1)},
            why="FP32 only: FP16 cannot hold pixel coordinates to a quarter pixel at 512 px, nor "
            "the flat photo index (y * 512 + x) the bilinear Gathers use",
        ),
    ),
)
