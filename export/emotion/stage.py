"""The emotion stage's declaration: the sentence emotion classifier (export/emotion/recipe.py)."""

from __future__ import annotations

from export.stage import ExportStage

STAGES = (
    ExportStage(
        "emotion_encoder",
        "export.emotion.recipe:EmotionEncoderRecipe",
        build_s=8.7,
        gate="export.emotion.int8:gate_folder",
    ),
)
