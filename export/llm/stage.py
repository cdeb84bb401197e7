"""The LLM stage's declaration: SmolLM2's decoder step with its KV cache (export/llm/recipe.py)."""

from __future__ import annotations

from export.common import Tolerance
from export.stage import ExportStage
from export.tensorrt.spec import Stage as EngineStage
from export.tensorrt.spec import ints, ones, positions

# Engine tolerances are stated, not measured: no engine has been built on the project
# machines (no TensorRT); tighten them from the first verification record on a GPU host.
STAGES = (
    ExportStage(
        "llm_decoder",
        "export.llm.recipe:LlmDecoderRecipe",
        build_s=150,
        gate="export.llm.recipe:gate_folder",
        engine=EngineStage(
            "export.llm.engine:DecoderProfile",
            ("fp32", "fp16", "int8"),
            "fp16",
            {"logits": Tolerance(0.1, 0.05), "present.*": Tolerance(0.05, 0.05)},
            inputs={"input_ids": ints(49152), "attention_mask": ones, "position_ids": positions},
            # prefill of 4 tokens after 16 cached ones, 2 rows (keeps the CPU reference quick)
            verify_axes={"batch": 2, "sequence": 4, "past_sequence": 16, "total_sequence": 20},
            why=(
                "FP16-safe additive mask (-1e4, export/llm/decoder_onnx.py);"
                " int4 variant failed its gate"
            ),
        ),
    ),
)
