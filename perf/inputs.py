"""Realistic perf_analyzer input data per model (real speech, real states)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Sample = dict[str, np.ndarray]


def vad_samples(count: int = 32) -> list[Sample]:
    """`count` consecutive chunks of real speech with the states the model really reaches."""
    from avatar.audio import reference_speech
    from avatar.vad import VadStream, chunks
    from export.common import onnx_session
    from export.registry import ensure_all

    session = onnx_session(ensure_all(["vad"])["vad"] / "model.onnx")
    speech = reference_speech("Could you tell me what the weather is like today in Paris?")
    stream, samples = VadStream(), []
    for chunk in chunks(speech)[:count]:
        feeds = stream.inputs(chunk[None])
        samples.append({k: v[0] for k, v in feeds.items()})
        names = ["speech_prob", "next_context", "next_state"]
        stream.update(dict(zip(names, session.run(names, feeds), strict=True)))
    return samples


def asr_samples() -> list[Sample]:
    """Two short spoken questions (the `asr` model takes one utterance per request)."""
    from avatar.audio import reference_speech

    texts = ["What time does the museum open on Sunday?", "Turn the lights off, please."]
    return [{"audio": reference_speech(t)} for t in texts]


SAMPLES: dict[str, Callable[[], list[Sample]]] = {"vad": vad_samples, "asr": asr_samples}
