"""Text-to-speech with a Piper VITS voice: text checks, normalisation, sentences, phonemes,
phoneme ids, seeded noise and phoneme timing. Triton-free; `model_repository/tts` adapts it."""

from avatar.tts.phonemes import Chunk, Phonemizer, Prepared, prepare
from avatar.tts.synth import Controls, SentenceAudio, Synthesizer, onnx_infer
from avatar.tts.voice import Voice, VoiceConfig, packaged_voice

__all__ = [
    "Chunk",
    "Controls",
    "Phonemizer",
    "Prepared",
    "SentenceAudio",
    "Synthesizer",
    "Voice",
    "VoiceConfig",
    "onnx_infer",
    "packaged_voice",
    "prepare",
]
