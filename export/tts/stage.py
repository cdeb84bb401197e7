"""The TTS stage's declaration: Piper's VITS voice (export/tts/recipe.py)."""

from __future__ import annotations

from export.stage import ExportStage

STAGES = (
    ExportStage(
        "tts_vits", "export.tts.recipe:VitsRecipe", build_s=26, gate="export.tts.int8:gate_folder"
    ),
)
