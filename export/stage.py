"""What an exported model stage declares, in one place per stage (`export/<stage>/stage.py`):
how its artifact is built (its recipe), how long that takes, what it needs built first, the
gate its INT8 variant must pass, and its TensorRT engine. `export/registry.py` registers
each stage module with one line; the build, the gates and the engine build read them there.
"""

from __future__ import annotations

import dataclasses

from export.tensorrt.spec import Stage as EngineStage


@dataclasses.dataclass(frozen=True)
class ExportStage:
    """One exported model (the Triton model name its artifact serves)."""

    model: str
    recipe: str  # "module:factory" of its export.common.ArtifactRecipe (imported lazily)
    # seconds its build took on a fresh 2-core machine (CI, 2026-11-27): a parallel build
    # starts the longest first, so that its lanes end together
    build_s: float
    needs: tuple[str, ...] = ()  # artifacts its build reads (a parallel build waits for them)
    gate: str | None = None  # "module:function": artifact folder -> its INT8 variant's record
    engine: EngineStage | None = None  # its TensorRT engine (tensorrt_plan in production)
