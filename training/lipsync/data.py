"""Labelled data for the audio -> viseme model, made by the project's own TTS.

The packaged Piper voice (through the exported `tts_vits` graph and `avatar.tts`) speaks
written sentences with varied controls; its per-phoneme durations give the exact time of
every phoneme, so the label of each audio frame is the viseme the TTS path animates there
(`avatar.animation.visemes.phonemes_to_segments`, the same tables). Utterances are cached
under the artifact cache (`lipsync_data/<key>.npz`); nothing here is committed but the
sentence lists (`avatar/animation/emotion_sentences.json`, written for the emotion model:
its 'train' split trains, its 'heldout' split - another register - only evaluates).

Augmentation (`augment`) turns one utterance into the 16 kHz audio a user might send:
pitch/formant and tempo shift by resampling (labels scaled exactly), gain, additive
white/pink noise at an SNR, band limiting through 8 kHz or a 16 k <-> 22.05 k round trip,
trailing digital silence.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from avatar.animation import tables
from avatar.animation.emotion import mouth_opening
from avatar.animation.pipeline import VISEME_TO_ARKIT_MATRIX
from avatar.animation.visemes import (
    VisemeSegment,
    closure_mask,
    phonemes_to_segments,
    viseme_weights,
)
from avatar.audio import resample

log = logging.getLogger(__name__)

SENTENCES = Path(__file__).resolve().parents[2] / "avatar/animation/emotion_sentences.json"
SAMPLE_RATE = 16000
FRAME_RATE = 100  # label/model frames per second (hop 160 samples at 16 kHz)
SILENT_SYMBOLS = {"^": ".", "$": "."}  # Piper's leading/trailing silence is a pause


@dataclasses.dataclass(frozen=True)
class Utterance:
    """One synthesized sentence: native-rate audio [samples] and its phoneme timings (s)."""

    text: str
    audio: np.ndarray  # float32, at `rate`
    rate: int
    phonemes: tuple[str, ...]
    starts: np.ndarray  # float64 [P]
    ends: np.ndarray  # float64 [P]

    @property
    def duration(self) -> float:
        return self.audio.size / self.rate


def sentences(split: str) -> list[str]:
    """The 'train' or 'heldout' sentences of emotion_sentences.json, in a fixed order."""
    data = json.loads(SENTENCES.read_text(encoding="utf-8"))[split]
    return [s for label in sorted(data) for s in data[label]]


def label_segments(utt: Utterance, scale: float = 1.0) -> list[VisemeSegment]:
    """The viseme segments the TTS path animates for `utt`, timeline times `scale`."""
    symbols = [SILENT_SYMBOLS.get(p, p) for p in utt.phonemes]
    return phonemes_to_segments(
        list(zip(symbols, utt.starts * scale, utt.ends * scale, strict=True))
    )


def frame_targets(utt: Utterance, frames: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Labels at FRAME_RATE: viseme class int64 [frames] and mouth opening float32 [frames].

    `scale` stretches the timeline (audio played 1/scale times faster has times * scale).
    Frame i is centred at i / FRAME_RATE (the model's STFT frames are centred); its label is
    the viseme segment there;
    the opening is the TTS path's (unsmoothed) blend of visemes with lip closures enforced.
    """
    segments = label_segments(utt, scale)
    centres = np.arange(frames) / FRAME_RATE
    ends = np.array([s.end for s in segments])
    which = np.minimum(np.searchsorted(ends, centres, side="right"), len(segments) - 1)
    labels = np.array([tables.VISEME_INDEX[segments[k].viseme] for k in which], np.int64)
    weights = viseme_weights(segments, centres)
    closed, closer = closure_mask(segments, centres)
    weights[closed] = 0.0
    weights[closed, closer[closed]] = 1.0
    opening = mouth_opening(weights @ VISEME_TO_ARKIT_MATRIX)
    return labels, opening.astype(np.float32)


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
    from export.common import cache_root

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
    from export.common import ensure, onnx_session
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


def save_utterances(path: Path, utts: list[Utterance]) -> None:
    lengths = np.array([u.audio.size for u in utts])
    counts = np.array([len(u.phonemes) for u in utts])
    pcm = np.concatenate([np.clip(u.audio, -1, 1) * 32767 for u in utts]).astype(np.int16)
    np.savez(
        path, pcm=pcm, lengths=lengths, counts=counts, rate=np.array([utts[0].rate]),
        texts=np.array([u.text for u in utts]),
        phonemes=np.array([p for u in utts for p in u.phonemes]),
        starts=np.concatenate([u.starts for u in utts]),
        ends=np.concatenate([u.ends for u in utts]),
    )  # fmt: skip


def load_utterances(path: Path) -> list[Utterance]:
    with np.load(path) as npz:
        data = {name: npz[name] for name in npz.files}  # each npz[name] reads the file again
    a = np.concatenate([[0], np.cumsum(data["lengths"])])
    p = np.concatenate([[0], np.cumsum(data["counts"])])
    rate, pcm, phonemes = int(data["rate"][0]), data["pcm"], data["phonemes"].tolist()
    return [
        Utterance(str(text), pcm[a[k] : a[k + 1]].astype(np.float32) / 32767, rate,
                  tuple(phonemes[p[k] : p[k + 1]]),
                  data["starts"][p[k] : p[k + 1]], data["ends"][p[k] : p[k + 1]])
        for k, text in enumerate(data["texts"])
    ]  # fmt: skip


# ------------------------------------------------------------------------ augmentation


@dataclasses.dataclass(frozen=True)
class Augment:
    """One draw of the augmentation: `shift` > 1 raises pitch/formants and speeds up."""

    shift: float = 1.0
    gain_db: float = 0.0
    snr_db: float | None = None  # None: no added noise
    pink: bool = False
    band: str = "full"  # "full", "8k" (telephone-like 8 kHz round trip), "22k" round trip
    zeros_s: float = 0.0  # digital silence appended (a padded recording), labelled sil

    @classmethod
    def draw(cls, rng: np.random.Generator) -> Augment:
        return cls(
            shift=float(rng.uniform(0.92, 1.08)) if rng.uniform() < 0.7 else 1.0,
            gain_db=float(rng.uniform(-24.0, 6.0)),
            snr_db=None if rng.uniform() < 0.3 else float(rng.choice([30.0, 20.0, 15.0, 10.0])),
            pink=bool(rng.uniform() < 0.5),
            band=str(rng.choice(["full", "full", "8k", "22k"])),
            zeros_s=0.0 if rng.uniform() < 0.7 else float(rng.uniform(0.0, 0.5)),
        )


def augment(utt: Utterance, aug: Augment, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """16 kHz float32 audio [n] of `utt` under `aug`, and the timeline scale for its labels."""
    ratio = Fraction(aug.shift).limit_denominator(50)
    # Reading audio at rate*shift as if it were at rate: pitch, formants and tempo * shift.
    audio = resample(utt.audio, round(utt.rate * ratio.numerator), SAMPLE_RATE * ratio.denominator)
    if aug.band == "8k":
        audio = resample(resample(audio, SAMPLE_RATE, 8000), 8000, SAMPLE_RATE)
    elif aug.band == "22k":
        audio = resample(resample(audio, SAMPLE_RATE, 22050), 22050, SAMPLE_RATE)
    audio = audio * np.float32(10 ** (aug.gain_db / 20))
    if aug.snr_db is not None:
        noise = rng.standard_normal(audio.size).astype(np.float32)
        if aug.pink:  # 1/f power: integrate white noise with a leak, then whiten the level
            noise = np.cumsum(noise) * 0.02
            noise -= np.convolve(noise, np.ones(400) / 400, mode="same")
        speech_power = float(np.mean(audio**2)) + 1e-12
        noise *= np.sqrt(speech_power / (np.mean(noise**2) + 1e-12) / 10 ** (aug.snr_db / 10))
        audio = audio + noise
    audio = np.concatenate([audio, np.zeros(round(aug.zeros_s * SAMPLE_RATE), np.float32)])
    return np.clip(audio, -1.0, 1.0).astype(np.float32), float(1.0 / float(ratio))
