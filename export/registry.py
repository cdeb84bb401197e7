"""Model name -> artifact recipe. One line per exported model; imports are lazy so that
building one stage does not import the heavy dependencies of the others."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from export.common import ArtifactRecipe

# "model name as in model_repository/": "module:factory"
RECIPES: dict[str, str] = {
    "asr_encoder": "export.asr:EncoderRecipe",
    "asr_decoder": "export.asr:DecoderRecipe",
    "vad": "export.vad:VadRecipe",
    "tts_vits": "export.tts:VitsRecipe",
    "llm_decoder": "export.llm:LlmDecoderRecipe",
    "renderer": "export.renderer:RendererRecipe",
    "lipsync": "export.lipsync:LipsyncRecipe",
}


def recipe(name: str) -> ArtifactRecipe:
    try:
        module_name, factory = RECIPES[name].split(":")
    except KeyError:
        raise KeyError(f"no export recipe for model {name!r}; known: {sorted(RECIPES)}") from None
    make: Callable[[], ArtifactRecipe] = getattr(importlib.import_module(module_name), factory)
    return make()


def ensure_all(names: list[str] | None = None, force: bool = False) -> dict[str, Path]:
    """Build (or find in the cache) the artifacts of `names` (default: every recipe)."""
    from export.common import ensure

    return {name: ensure(recipe(name), force=force) for name in (names or sorted(RECIPES))}
