"""Realistic perf_analyzer input data per model (real speech, real states)."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from avatar.model_io import ASR, ASR_ENCODER, AVATAR_SAY, LLM, RENDERER, TTS

Sample = dict[str, np.ndarray]


def vad_samples(count: int = 32) -> list[Sample]:
    """`count` consecutive chunks of real speech with the states the model really reaches."""
    from avatar.audio import reference_speech
    from avatar.vad import OUTPUTS, VadStream, chunks
    from export.common import onnx_session
    from export.registry import ensure_all

    session = onnx_session(ensure_all(["vad"])["vad"] / "model.onnx")
    speech = reference_speech("Could you tell me what the weather is like today in Paris?")
    stream, samples = VadStream(), []
    for chunk in chunks(speech)[:count]:
        feeds = stream.inputs(chunk[None])
        samples.append(_row(feeds))
        stream.update(dict(zip(OUTPUTS, session.run(list(OUTPUTS), feeds), strict=True)))
    return samples


def asr_samples() -> list[Sample]:
    """Two short spoken questions (the `asr` model takes one utterance per request)."""
    from avatar.audio import reference_speech

    texts = ["What time does the museum open on Sunday?", "Turn the lights off, please."]
    return [_row(ASR.request(audio=reference_speech(t))) for t in texts]


# --------------------------------------------------------------------------- shared text

QUESTIONS = (
    "Hello! When can I check in?",
    "Where is breakfast served?",
    "How much is parking in the garage?",
    "Can I borrow an umbrella?",
    "How do I get to the train station?",
    "When does the spa open?",
    "Is there a gym in the hotel?",
    "Can you call me a taxi, please?",
)
REPLY_SENTENCES = (
    "Check-in is from three in the afternoon.",
    "Breakfast is served from seven to ten in the Lighthouse room on the ground floor.",
    "Parking costs twenty euros a night.",
    "Of course, you can borrow an umbrella at the desk!",
    "The station is a ten minute walk along the river.",
    "The spa on the second floor opens at nine in the morning.",
)
SAMPLING = {"seed": 0, "max_tokens": 48}  # fixed: every run generates the same replies


def _bytes(text: str) -> np.ndarray:
    return np.array([text.encode("utf-8")], dtype=object)


def _row(tensors: Sample, row: int = 0) -> Sample:
    """One row of a batched model's tensors (perf_analyzer's data have no batch axis)."""
    return {name: array[row] for name, array in tensors.items()}


# --------------------------------------------------------------------------- native models


def tts_vits_samples(texts: tuple[str, ...] = REPLY_SENTENCES) -> list[Sample]:
    """Real reply sentences phonemized with the packaged voice, padded like the `tts` model
    pads them (ids to a multiple of 64, fixed-length noise)."""
    from avatar.tts.phonemes import Phonemizer, prepare
    from avatar.tts.synth import Controls, batch_inputs
    from avatar.tts.voice import packaged_voice

    voice = packaged_voice()
    phonemizer = Phonemizer(voice.config)
    controls = Controls.defaults(voice.config)
    samples = []
    for text in texts:
        for chunk in prepare(text, phonemizer).chunks:
            samples.append(_row(batch_inputs([chunk.ids], [controls], pad_to=64)))
    return samples


def asr_encoder_samples() -> list[Sample]:
    """Log-mel of real spoken questions in full 30-s windows (the asr model's default)."""
    from avatar.asr.features import log_mel, pad_or_trim
    from avatar.audio import reference_speech

    mels = [pad_or_trim(log_mel(reference_speech(t))) for t in QUESTIONS[:2]]
    return [_row(ASR_ENCODER.rows(mel=mel[None])) for mel in mels]


def renderer_samples(count: int = 32) -> list[Sample]:
    """ARKit-52 frames and head poses of a real spoken sentence (TTS phoneme timings ->
    avatar.animation), one frame per sample."""
    from avatar.animation.pipeline import animate
    from avatar.tts.phonemes import Phonemizer
    from avatar.tts.synth import Controls, Synthesizer, onnx_infer
    from avatar.tts.voice import packaged_voice
    from export.common import onnx_session
    from serving.served import served_onnx

    voice = packaged_voice()
    session = onnx_session(served_onnx("tts_vits"))
    synth = Synthesizer(Phonemizer(voice.config), onnx_infer(session))
    (speech,) = list(synth.stream(REPLY_SENTENCES[1], Controls.defaults(voice.config)))[:1]
    timings = zip(speech.phonemes, speech.starts.tolist(), speech.ends.tolist(), strict=True)
    animation = animate(list(timings), text=speech.text)
    step = max(1, len(animation.blendshapes) // count)
    frames = RENDERER.rows(
        blendshapes=animation.blendshapes[::step][:count],
        head_pose=animation.head_pose[::step][:count],
    )
    return [_row(frames, i) for i in range(len(frames["blendshapes"]))]


# --------------------------------------------------------------------------- public models


def tts_samples() -> list[Sample]:
    return [TTS.request(text=t) for t in REPLY_SENTENCES]


def avatar_say_samples() -> list[Sample]:
    return [AVATAR_SAY.request(text=t) for t in REPLY_SENTENCES[:3]]


def llm_samples() -> list[Sample]:
    return [
        LLM.request(messages=[{"role": "user", "content": q}], sampling=SAMPLING)
        for q in QUESTIONS[:4]
    ]


def avatar_samples() -> list[Sample]:
    """Spoken questions (16 kHz, the packaged voice) with fixed seed and max_tokens."""
    from avatar.audio import reference_speech

    controls = _bytes(json.dumps({"seed": 0, "max_tokens": SAMPLING["max_tokens"]}))
    return [{"audio": reference_speech(q), "controls": controls} for q in QUESTIONS[:2]]


SAMPLES: dict[str, Callable[[], list[Sample]]] = {
    "vad": vad_samples,
    "asr": asr_samples,
    "tts": tts_samples,
    "llm": llm_samples,
    "renderer": renderer_samples,
    "portrait_renderer": renderer_samples,  # the same ARKit frames and head poses
    "avatar_say": avatar_say_samples,
    "avatar": avatar_samples,
    "tts_vits": tts_vits_samples,
    "asr_encoder": asr_encoder_samples,
}
# decoupled models: perf_analyzer needs --streaming (gRPC stream) for them
STREAMING = {"tts", "llm", "avatar"}
