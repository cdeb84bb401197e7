"""Sentences spoken by the exported VITS graph (`tts_vits`, the packaged Piper voice) with
the time of every phoneme: the lipsync model's training data and its INT8 gate's held-out
set (`evals.lipsync` labels and scores them).

Utterances are cached under the artifact cache (`lipsync_data/<key>.npz`, 16-bit audio), so
every run, the first included, sees the same samples; nothing here is committed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from evals.lipsync import Utterance, load_utterances, save_utterances
from export.common import cache_root, ensure, onnx_session

log = logging.getLogger(__name__)


def controls_for(index: int, variant: int, varied: bool):  # -> avatar.tts.Controls
    """Varied scales for training; the voice's defaults (with a seed) for evaluation."""
    from avatar.tts import Controls, packaged_voice

    config = packaged_voice().config
    seed = 1000 * index + variant
    if not varied:
        return Controls.defaults(config, seed=seed)
    rng = np.random.default_rng(seed)
    return Controls(
        length_scale=float(rng.uniform(0.8, 1.35)),
        noise_scale=float(rng.uniform(0.3, 0.9)),
        noise_w=float(rng.uniform(0.3, 1.1)),
        seed=seed,
    )


def load_or_synthesize(
    texts: list[str], variants: int = 1, varied: bool = True, cache: Path | None = None
) -> list[Utterance]:
    """Speak every text `variants` times with `controls_for`; cached as one npz per set."""
    return cached_utterances(
        "", [texts, variants, varied], lambda: speak(texts, variants, varied), cache
    )


def cached_utterances(
    prefix: str, key: Any, make: Callable[[], list[Utterance]], cache: Path | None = None
) -> list[Utterance]:
    """`make()`, saved once as <cache>/lipsync_data/<prefix><hash of key>.npz and read back
    from there, so every run (the first included) sees the same 16-bit audio."""
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    path = Path(cache or cache_root() / "lipsync_data") / f"{prefix}{digest}.npz"
    if not path.is_file():
        utts = make()
        path.parent.mkdir(parents=True, exist_ok=True)
        save_utterances(path, utts)
    return load_utterances(path)


def speak(texts: list[str], variants: int, varied: bool) -> list[Utterance]:
    from avatar.tts import Phonemizer, Synthesizer, onnx_infer, packaged_voice
    from avatar.tts.synth import joined
    from export.tts.recipe import VitsRecipe

    session = onnx_session(ensure(VitsRecipe()) / "model.onnx", threads=1)
    synth = Synthesizer(Phonemizer(packaged_voice().config), onnx_infer(session))
    out = []
    for i, text in enumerate(texts):
        for v in range(variants):
            whole = joined(list(synth.stream(text, controls_for(i, v, varied))), text)
            out.append(Utterance(text, whole.audio, whole.sample_rate, whole.phonemes,
                                 whole.starts, whole.ends))  # fmt: skip
        if i % 20 == 0:
            log.info("synthesized %d/%d texts", i + 1, len(texts))
    return out
