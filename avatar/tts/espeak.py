"""espeak-ng's own (formant) synthesiser: audio and the time of every phoneme it speaks.

The packaged fallback voice for a language without a Piper voice (Mandarin: espeak-ng's
"cmn"). It uses the libespeak-ng that `piper-phonemize` bundles (the library the Piper
phonemizer already runs, with its own espeak-ng-data), through ctypes, or the system's
`libespeak-ng.so.1` (Debian's `libespeak-ng1`) when piper-phonemize is absent; nothing is
loaded until a fallback voice is first used, so English users need neither.

Timings come from espeak-ng's phoneme events (`espeak_ng_SetPhonemeEvents(1, ipa=1)`):
each event gives the IPA of one phoneme (sometimes a cluster, "tɕh", "iou") and the
sample where it starts; a cluster's span is shared among its letters.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import importlib.util
import logging
import threading
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from avatar.errors import RequestError
from avatar.tts.phonemes import ESPEAK_LOCK
from avatar.tts.voice import BOS, EOS

log = logging.getLogger(__name__)

PAUSE = " "  # a silent phoneme event (a pause, a word gap) is reported as a word boundary
DEFAULT_RATE_WPM = 175  # espeak-ng's default speaking rate
_RATE_RANGE = (80, 450)  # what espeak-ng accepts
_EVENT_PHONEME, _EVENT_END = 7, 0  # espeakEVENT_PHONEME, espeakEVENT_LIST_TERMINATED
_PARAM_RATE = 1  # espeakRATE
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):  # espeak_EVENT (speak_lib.h)
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


_Callback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


class EspeakUnavailableError(RuntimeError):
    """Neither piper-phonemize's libespeak-ng nor the system's could be loaded."""


def _bundled() -> tuple[Path, Callable[[], None]] | None:
    """piper-phonemize's libespeak-ng, and how to initialise it as piper does (its
    `phonemize_espeak` initialises the library once, with its espeak-ng-data)."""
    spec = importlib.util.find_spec("piper_phonemize")
    if spec is None or spec.origin is None:
        return None
    libs = sorted((Path(spec.origin).parents[1] / "piper_phonemize.libs").glob("libespeak-ng*"))
    if not libs:
        return None

    def initialise() -> None:
        from piper_phonemize import phonemize_espeak

        phonemize_espeak("a", "en-us")  # called under ESPEAK_LOCK

    return libs[0], initialise


class _Library:
    """The loaded library, its sample rate and our callback (one per process: espeak-ng
    keeps global state; every use holds ESPEAK_LOCK)."""

    _instance: _Library | None = None
    _load_lock = threading.Lock()

    def __init__(self) -> None:
        found = _bundled()
        if found is not None:
            path, initialise = found
            self.lib = ctypes.CDLL(str(path))
            initialise()
        else:
            name = ctypes.util.find_library("espeak-ng")
            if name is None:
                raise EspeakUnavailableError(
                    "espeak-ng is not installed: install piper-phonemize (bundles it) or "
                    "Debian's libespeak-ng1"
                )
            self.lib = ctypes.CDLL(name)
            self.lib.espeak_Initialize.argtypes = [
                ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
            ]  # fmt: skip
            if self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, 0) <= 0:
                raise EspeakUnavailableError(f"espeak_Initialize failed ({name})")
            path = Path(name)
        self.lib.espeak_ng_SetPhonemeEvents.argtypes = [ctypes.c_int, ctypes.c_int]
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]  # fmt: skip
        self.sample_rate = int(self.lib.espeak_ng_GetSampleRate())
        self.audio: list[np.ndarray] = []
        self.events: list[tuple[str, int]] = []
        self.callback = _Callback(self._collect)  # kept referenced while the library lives
        log.info("espeak-ng: %s (%d Hz)", path.name, self.sample_rate)

    @classmethod
    def get(cls) -> _Library:
        with cls._load_lock:
            if cls._instance is None:
                with ESPEAK_LOCK:
                    cls._instance = cls()
            return cls._instance

    def _collect(self, wav, count: int, events) -> int:
        if count > 0 and wav:
            self.audio.append(np.ctypeslib.as_array(wav, (count,)).copy())
        k = 0
        while events and events[k].type != _EVENT_END:
            event = events[k]
            if event.type == _EVENT_PHONEME:
                self.events.append((_event_name(bytes(event.id.string)), int(event.sample)))
            k += 1
        return 0  # go on

    def synthesize(self, text: str, voice: str, rate: int) -> tuple[np.ndarray, list]:
        """int16 samples and (ipa, first sample) per phoneme event, under ESPEAK_LOCK.

        The voice, rate and phoneme events are set on every call: piper-phonemize shares
        the library and sets its own voice (and re-initialising turns events off).
        """
        data = text.encode("utf-8") + b"\0"
        with ESPEAK_LOCK:
            self.audio, self.events = [], []
            if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise RequestError(f"espeak-ng has no voice {voice!r}")
            self.lib.espeak_ng_SetPhonemeEvents(1, 1)
            self.lib.espeak_SetParameter(_PARAM_RATE, rate, 0)
            self.lib.espeak_SetSynthCallback(self.callback)
            status = self.lib.espeak_Synth(data, len(data), 0, 0, 0, _CHARS_UTF8, None, None)
            self.lib.espeak_SetParameter(_PARAM_RATE, DEFAULT_RATE_WPM, 0)
            audio = np.concatenate(self.audio) if self.audio else np.zeros(0, np.int16)
            events = self.events
        if status != 0:
            raise RuntimeError(f"espeak_Synth failed with status {status}")
        return audio, events


def _event_name(raw: bytes) -> str:
    """A phoneme event's name: its first 8 bytes up to a NUL, letters and marks only.

    espeak-ng does not always end a shorter name with a NUL: the bytes after it are stale
    memory (after piper-phonemize had used the library: "tɕh`%\x7f\ufffd"), and a name of 8
    bytes may end inside a character. Those are dropped, not passed on as phonemes."""
    text = raw.split(b"\0")[0].decode("utf-8", "ignore")
    return "".join(c for c in text if c in _NAME_MARKS or unicodedata.category(c) in _LETTERS)


_LETTERS = frozenset({"Ll", "Lu", "Lm", "Lo", "Mn"})  # IPA letters, "ʰ", combining marks
_NAME_MARKS = frozenset(".-˥˦˧˨˩")  # espeak-ng's syllable and stress marks, tone letters


def rate_for(length_scale: float) -> int:
    """Piper's length_scale (> 1 slower) -> espeak-ng words per minute."""
    return int(np.clip(round(DEFAULT_RATE_WPM / length_scale), *_RATE_RANGE))


def _letters(ipa: str) -> list[str]:
    """An event's IPA split into code points (espeak-ng's own marks stay separate)."""
    return [c for c in ipa if not c.isspace()]


def event_timings(
    events: list[tuple[str, int]],
    samples: int,
    sample_rate: int,
    rewrite: Callable[[list[str]], Sequence[str]] | None = None,
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """Phoneme events -> (symbols, starts, ends) in seconds covering [0, samples].

    '^' is the silence before the first phoneme and '$' the end; a silent event is a word
    boundary ' ' lasting until the next phoneme; the letters of a cluster share its span
    equally, except combining marks and espeak's "." and "-", which take none;
    `rewrite` relabels the letters of one event, one for one (`mandarin.to_ipa`).
    """
    marks = set(".-") | {chr(c) for c in range(0x300, 0x370)}
    bounds = [min(max(s, 0), samples) for _, s in events] + [samples]
    symbols: list[str] = [BOS]
    starts: list[float] = [0.0]
    ends: list[float] = [bounds[0] if events else samples]
    for (ipa, _), start, end in zip(events, bounds[:-1], bounds[1:], strict=True):
        letters = _letters(ipa) or [PAUSE]
        if letters == [PAUSE] and symbols[-1] == PAUSE:  # consecutive pauses: one
            ends[-1] = end
            continue
        voiced = [c for c in letters if c not in marks] or letters
        step = (end - start) / len(voiced)
        at = float(start)
        names = list(rewrite(letters)) if rewrite and letters != [PAUSE] else letters
        for letter, name in zip(letters, names, strict=True):
            width = 0.0 if letter in marks and len(voiced) < len(letters) else step
            symbols.append(name)
            starts.append(at)
            ends.append(at + width)
            at += width
    symbols.append(EOS)
    starts.append(float(samples))
    ends.append(float(samples))
    scale = 1.0 / sample_rate
    return (
        tuple(symbols),
        np.asarray(starts, np.float64) * scale,
        np.asarray(ends, np.float64) * scale,
    )


@dataclasses.dataclass(frozen=True)
class EspeakVoice:
    """One espeak-ng voice (e.g. "cmn"): text -> float32 audio and phoneme timings."""

    voice: str
    # relabels the letters of one phoneme event (espeak-ng's notation -> IPA), one for one
    rewrite: Callable[[list[str]], Sequence[str]] | None = None

    @property
    def sample_rate(self) -> int:
        return _Library.get().sample_rate

    def synthesize(
        self, text: str, length_scale: float = 1.0
    ) -> tuple[np.ndarray, tuple[str, ...], np.ndarray, np.ndarray]:
        """audio float32 [samples] in [-1, 1], and (symbols, starts, ends) in seconds."""
        library = _Library.get()
        pcm, events = library.synthesize(text, self.voice, rate_for(length_scale))
        audio = pcm.astype(np.float32) / 32768.0
        symbols, starts, ends = event_timings(events, pcm.size, library.sample_rate, self.rewrite)
        return audio, symbols, starts, ends


def available() -> bool:
    """Whether an espeak-ng library can be loaded (for a clear error at model load)."""
    try:
        _Library.get()
    except (EspeakUnavailableError, OSError) as error:
        log.warning("espeak-ng unavailable: %s", error)
        return False
    return True
