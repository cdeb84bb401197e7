"""A second synthesizer: espeak-ng formant voices with phoneme timings.

espeak-ng (the library bundled in the `piper_phonemize` wheel, with its data) reports a
phoneme event with the IPA name and the sample at which each phoneme starts
(`espeakINITIALIZE_PHONEME_EVENTS | espeakINITIALIZE_PHONEME_IPA`). A phoneme lasts until
the next event; a multi-symbol IPA name (eɪ, tʃ, ɑː) shares its span evenly among its
symbols, and `avatar.animation.visemes` merges them as for Piper. Formant synthesis
sounds nothing like the Piper voice: the training mixes in TRAIN_VOICES on the training
sentences (a second "speaker" family), and EVAL_VOICES on the held-out sentences are the
project's offline stand-in for "a different speaker".
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

import numpy as np

from evals.lipsync import Utterance
from export.tts.utterances import cached_utterances

TRAIN_VOICES = ("en-us+m1", "en-us+f1", "en-us+m3", "en-us+f3", "en-us+m5", "en-us+m4")
EVAL_VOICES = ("en-us+m7", "en-us+f4", "en-us+m2", "en-us+f5")  # never trained on
_RATE, _PITCH = 1, 3  # espeak_PARAMETER
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_PHONEME_EVENTS, _PHONEME_IPA = 0x0001, 0x0002
_EVENT_PHONEME, _EVENT_END = 7, 0
_LOCK = threading.Lock()


class _Id(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    """espeak_EVENT of speak_lib.h."""

    _fields_ = [
        ("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int), ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p), ("id", _Id),
    ]  # fmt: skip


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


def _library() -> tuple[ctypes.CDLL, int]:
    import piper_phonemize

    root = os.path.dirname(piper_phonemize.__file__)
    found = glob.glob(os.path.join(root, os.pardir, "piper_phonemize.libs", "libespeak-ng*.so*"))
    if not found:
        raise FileNotFoundError("piper_phonemize's bundled libespeak-ng was not found")
    lib = ctypes.CDLL(found[0])
    data = os.path.join(root, "espeak-ng-data").encode()
    rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, _PHONEME_EVENTS | _PHONEME_IPA)
    if rate <= 0:
        raise RuntimeError(f"espeak_Initialize failed ({rate})")
    return lib, rate


def load_or_speak(
    texts: list[str], voices: tuple[str, ...] = EVAL_VOICES, seed: int | None = None
) -> list[Utterance]:
    """`speak`, cached under the artifact cache (lipsync_data/espeak-<key>.npz).

    espeak-ng adds noise of its own that no seed here controls, and its timing depends a
    little on what it spoke before in the process: the cache makes training and the
    evaluation repeatable; a fresh cache gives slightly different audio.
    """
    return cached_utterances("espeak-", [texts, voices, seed], lambda: speak(texts, voices, seed))


def speak(
    texts: list[str], voices: tuple[str, ...] = EVAL_VOICES, seed: int | None = None
) -> list[Utterance]:
    """Text i spoken by voices[i % len(voices)] -> Utterances (audio at espeak's 22050 Hz).

    With a `seed`, each text also gets a random rate (140-230 words/min) and pitch (25-75);
    otherwise espeak's defaults (175 words/min, pitch 50).
    """
    rng = np.random.default_rng(seed)
    with _LOCK:
        lib, rate = _library()
        samples: list[np.ndarray] = []
        events: list[tuple[str, int]] = []

        @_CALLBACK
        def collect(wav, count, event):
            if count > 0:
                samples.append(np.ctypeslib.as_array(wav, (count,)).copy())
            k = 0
            while event[k].type != _EVENT_END:
                if event[k].type == _EVENT_PHONEME:
                    events.append((_name(bytes(event[k].id.string)), int(event[k].sample)))
                k += 1
            return 0

        lib.espeak_SetSynthCallback(collect)
        out = []
        for i, text in enumerate(texts):
            if lib.espeak_SetVoiceByName(voices[i % len(voices)].encode()) != 0:
                raise RuntimeError(f"espeak-ng has no voice {voices[i % len(voices)]!r}")
            rate_wpm, pitch = (175, 50) if seed is None else rng.integers((140, 25), (231, 76))
            lib.espeak_SetParameter(_RATE, int(rate_wpm), 0)
            lib.espeak_SetParameter(_PITCH, int(pitch), 0)
            raw = text.encode()
            samples.clear()
            events.clear()
            lib.espeak_Synth(raw, len(raw) + 1, 0, 0, 0, 0, None, None)
            audio = np.concatenate(samples).astype(np.float32) / 32768.0
            out.append(_utterance(text, audio, rate, list(events)))
    return out


def _name(raw: bytes) -> str:
    """The IPA name of a phoneme event: the id is 8 bytes that need not end with a NUL, so
    keep the leading IPA letters and length marks (espeak leaves stale bytes after them)."""
    text = raw.decode("utf-8", "ignore")
    name = ""
    for char in text:
        if not ((char.isalpha() and not ("A" <= char <= "Z")) or char in "ːˑ"):
            break
        name += char
    return name


def _utterance(text: str, audio: np.ndarray, rate: int, events: list[tuple[str, int]]) -> Utterance:
    """Phoneme events (IPA name, start sample) -> an Utterance with per-symbol timings.

    An event lasts until the next one; an empty name (a clause boundary) is a pause, and
    so are the audio before the first event and after the last.
    """
    duration = audio.size / rate
    marks = [(name.strip() or ".", sample / rate) for name, sample in events]
    if not marks or marks[0][1] > 0:
        marks.insert(0, (".", 0.0))
    symbols, starts, ends = [], [], []
    for k, (name, start) in enumerate(marks):
        end = marks[k + 1][1] if k + 1 < len(marks) else duration
        share = (end - start) / len(name)
        for j, symbol in enumerate(name):
            symbols.append(symbol)
            starts.append(start + j * share)
            ends.append(start + (j + 1) * share)
    return Utterance(text, audio, rate, tuple(symbols), np.array(starts), np.array(ends))
