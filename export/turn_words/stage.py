"""The turn words stage's declaration: the words' end of turn (export/turn_words/recipe.py)."""

from __future__ import annotations

from export.stage import ExportStage

STAGES = (ExportStage("turn_words", "export.turn_words.recipe:TurnWordsRecipe", build_s=20),)
