"""Model name -> artifact recipe. One line per exported model; imports are lazy so that
building one stage does not import the heavy dependencies of the others."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

from export.common import ArtifactRecipe

# "model name as in model_repository/": "module:factory"
RECIPES: dict[str, str] = {
    "asr_encoder": "export.asr.recipe:EncoderRecipe",
    "asr_decoder": "export.asr.recipe:DecoderRecipe",
    "vad": "export.vad.recipe:VadRecipe",
    "tts_vits": "export.tts.recipe:VitsRecipe",
    "llm_decoder": "export.llm.recipe:LlmDecoderRecipe",
    "renderer": "export.renderer.recipe:RendererRecipe",
    "portrait_renderer": "export.portrait.recipe:PortraitRecipe",
    "lipsync": "export.lipsync.recipe:LipsyncRecipe",
    "emotion_encoder": "export.emotion.recipe:EmotionEncoderRecipe",
    "turn_detector": "export.turn_detector.recipe:TurnDetectorRecipe",
    "turn_words": "export.turn_words.recipe:TurnWordsRecipe",
}

# Models whose INT8 variant (model.int8.onnx) is judged by a gate: "module:function", the
# function taking the artifact folder and returning the gate's record (export.gates).
GATES: dict[str, str] = {
    "asr_encoder": "export.asr.int8:gate_folder",
    "asr_decoder": "export.asr.int8:gate_folder",
    "emotion_encoder": "export.emotion.int8:gate_folder",
    "lipsync": "export.lipsync.int8:gate_folder",
    "llm_decoder": "export.llm.recipe:gate_folder",
    "tts_vits": "export.tts.int8:gate_folder",
}


def gate(name: str) -> Callable[[Path], dict]:
    """The gate of `name`'s INT8 variant: artifact folder -> the gate's record."""
    try:
        module_name, function = GATES[name].split(":")
    except KeyError:
        raise KeyError(f"no INT8 gate for model {name!r}; gated: {sorted(GATES)}") from None
    return getattr(importlib.import_module(module_name), function)


def recipe(name: str, variants: bool = False) -> ArtifactRecipe:
    """The recipe of `name`; `variants`: also its precision variants, where it has any
    (ASR INT8/FP16, LLM int4), which only reports and engine builds read."""
    try:
        module_name, factory = RECIPES[name].split(":")
    except KeyError:
        raise KeyError(f"no export recipe for model {name!r}; known: {sorted(RECIPES)}") from None
    make: Callable[..., ArtifactRecipe] = getattr(importlib.import_module(module_name), factory)
    if variants and "variants" in inspect.signature(make).parameters:
        return make(variants=True)
    return make()


# Artifacts a recipe's build reads (a parallel build starts it once they are built).
NEEDS: dict[str, tuple[str, ...]] = {"lipsync": ("tts_vits",)}  # calibration speech
# Longest builds first, so that parallel lanes end together (seconds on 2 cores, measured).
ORDER = ("llm_decoder", "asr_encoder", "asr_decoder", "tts_vits", "lipsync",
         "portrait_renderer", "emotion_encoder", "turn_words", "turn_detector", "renderer",
         "vad")  # fmt: skip


def ensure_all(
    names: list[str] | None = None, force: bool = False, variants: bool = False, jobs: int = 1
) -> dict[str, Path]:
    """Build (or find in the cache) the artifacts of `names` (default: every recipe), up to
    `jobs` at a time in their own processes."""
    from export.common import ensure

    names = list(names or sorted(RECIPES))
    if jobs > 1 and len(names) > 1:
        _build_in_parallel(names, force, variants, jobs)
        force = False  # built just now
    return {name: ensure(recipe(name, variants), force=force) for name in names}


def _build_in_parallel(names: list[str], force: bool, variants: bool, jobs: int) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from export.common import worker_logging

    rank = {name: k for k, name in enumerate(ORDER)}
    pending = {n: set(NEEDS.get(n, ())) & set(names) for n in sorted(names, key=rank.get)}
    running = {}
    context = multiprocessing.get_context("spawn")  # no forked torch / ONNX Runtime threads
    with ProcessPoolExecutor(jobs, context, initializer=worker_logging) as pool:
        while pending or running:
            ready = [n for n, needs in pending.items() if not needs][: jobs - len(running)]
            for name in ready:
                running[pool.submit(_build, name, force, variants)] = name
                del pending[name]
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                built = running.pop(future)
                future.result()  # a failed build fails the whole
                for needs in pending.values():
                    needs.discard(built)


def _build(name: str, force: bool, variants: bool) -> None:
    from export.common import ensure

    ensure(recipe(name, variants), force=force)
