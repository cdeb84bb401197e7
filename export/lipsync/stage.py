"""The lipsync stage's declaration: the audio-to-viseme model (export/lipsync/recipe.py)."""

from __future__ import annotations

from export.stage import ExportStage

STAGES = (
    ExportStage(
        "lipsync",
        "export.lipsync.recipe:LipsyncRecipe",
        build_s=4.5,
        needs=("tts_vits",),  # its calibration speech
        gate="export.lipsync.int8:gate_folder",
    ),
)
