"""The exported model stages: one registration line per stage below, each stage's own
declaration (recipe, build time, needs, INT8 gate, TensorRT engine) in its folder
(`export/<stage>/stage.py`, an `export.stage.ExportStage` each). Recipes are imported
lazily, so that building one stage does not import the heavy dependencies of the others.

A new model stage: its config (+ adapter) in `model_repository/<model>/`, its recipe and
`stage.py` in `export/<stage>/`, its core in `avatar/`, and one line here."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

from export.common import ArtifactRecipe
from export.stage import ExportStage
from export.tensorrt.spec import Stage as EngineStage

STAGE_MODULES = (
    "export.asr.stage",
    "export.vad.stage",
    "export.tts.stage",
    "export.llm.stage",
    "export.renderer.stage",
    "export.portrait.stage",
    "export.lipsync.stage",
    "export.emotion.stage",
    "export.turn_detector.stage",
    "export.turn_words.stage",
)


@functools.cache
def stages() -> dict[str, ExportStage]:
    """Every registered stage, by the Triton model name its artifact serves."""
    out: dict[str, ExportStage] = {}
    for module in STAGE_MODULES:
        for stage in importlib.import_module(module).STAGES:
            if stage.model in out:
                raise ValueError(f"{module}: model {stage.model!r} is declared twice")
            out[stage.model] = stage
    return out


# model name -> "module:factory"; gated model -> "module:function" (export.gates)
RECIPES: dict[str, str] = {name: s.recipe for name, s in stages().items()}
GATES: dict[str, str] = {name: s.gate for name, s in stages().items() if s.gate}
NEEDS: dict[str, tuple[str, ...]] = {name: s.needs for name, s in stages().items() if s.needs}
# longest builds first, so that parallel lanes end together
ORDER = tuple(sorted(stages(), key=lambda name: -stages()[name].build_s))


def engine_stages() -> dict[str, EngineStage]:
    """The TensorRT engine of each stage that declares one (export/tensorrt/build.py)."""
    return {name: s.engine for name, s in stages().items() if s.engine is not None}


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
