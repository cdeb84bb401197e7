"""The ASR stage's declaration: Whisper's encoder and decoder step (export/asr/recipe.py)."""

from __future__ import annotations

from export.common import Tolerance
from export.stage import ExportStage
from export.tensorrt.spec import Stage as EngineStage
from export.tensorrt.spec import ints

# Engine tolerances are stated, not measured: no engine has been built on the project
# machines (no TensorRT); tighten them from the first verification record on a GPU host.
STAGES = (
    ExportStage(
        "asr_encoder",
        "export.asr.recipe:EncoderRecipe",
        build_s=42,
        gate="export.asr.int8:gate_folder",
        engine=EngineStage(
            "export.asr.engine:Profile",
            ("fp32", "fp16", "int8"),
            "fp16",
            {"encoder_hidden_states": Tolerance(0.05, 0.05), "cross_kv": Tolerance(0.05, 0.05)},
            verify_axes={"batch": 1},  # a full 30-s window (9M cross_kv values per row)
            why="INT8 from the Q/DQ variant when its WER gate passed, short clips and VAD-cut "
            "long recordings (export/asr/int8.py); today's variant fails the long ones (it loops "
            "on one 30-s piece, docs/performance.md 10), so FP16",
        ),
    ),
    ExportStage(
        "asr_decoder",
        "export.asr.recipe:DecoderRecipe",
        build_s=48,
        gate="export.asr.int8:gate_folder",
        engine=EngineStage(
            "export.asr.engine:Profile",
            ("fp32", "fp16"),
            "fp16",
            {
                "logits": Tolerance(0.1, 0.05),
                "self_kv_out": Tolerance(0.05, 0.05),
                "cross_kv_out": Tolerance(0.01, 0.01),  # the state fed back: FP16 rounding only
            },
            inputs={"tokens": ints(51865)},
            # a later step of 2 windows: the cross-attention state full, encoder_kv empty
            verify_axes={"batch": 2, "tokens": 3},
            why="no INT8: its Q/DQ variant is the stateless step the CPU gate judges (it fails the "
            "WER gate, export/asr/int8.py), not the sequence form served with implicit state; "
            "one token's activations are too small for INT8 GEMMs to pay",
            int8_by_default=False,
        ),
    ),
)
