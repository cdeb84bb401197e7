"""Controls, seeded noise, batching and phoneme timing around the exported VITS graph.

`Synthesizer` is Triton-free: it takes any `infer(inputs) -> outputs` callable with the
tensor names of `export/tts/graph.py` (an ONNX Runtime session in tests and the report,
a BLS call to `tts_vits` in the Triton model).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import ClassVar

import numpy as np

from avatar.errors import RequestError
from avatar.model_io import TTS_VITS
from avatar.tts.phonemes import Chunk, Phonemizer, prepare
from avatar.tts.voice import VoiceConfig

log = logging.getLogger(__name__)

HIDDEN_CHANNELS = 192
NOISE_PHONEMES = 512  # >= 2 * MAX_PHONEMES + 2 ids: no repetition within a chunk
NOISE_FRAMES = 1024  # ~11.9 s at 86.1 frames/s; the graph repeats it for longer chunks
InferFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Controls:
    """Per-request synthesis controls, checked against their ranges.

    length_scale: > 1 speaks slower (speed = 1 / length_scale); noise_scale: variation of
    the voice; noise_w: variation of phoneme durations; seed: same seed, same audio.
    """

    length_scale: float
    noise_scale: float
    noise_w: float
    seed: int = 0

    RANGES: ClassVar[dict[str, tuple[float, float]]] = {
        "length_scale": (0.25, 4.0),
        "noise_scale": (0.0, 2.0),
        "noise_w": (0.0, 2.0),
    }

    def __post_init__(self) -> None:
        for name, (low, high) in self.RANGES.items():
            value = getattr(self, name)
            if not (np.isfinite(value) and low <= value <= high):
                raise RequestError(f"{name}={value}: expected a number in [{low}, {high}]")
        if not 0 <= int(self.seed) < 2**63:
            raise RequestError(f"seed={self.seed}: expected an integer in [0, 2**63)")

    @classmethod
    def defaults(cls, config: VoiceConfig, **overrides: float | int | None) -> Controls:
        """The voice's default scales, with the given (non-None) values instead."""
        values = {
            "length_scale": config.length_scale,
            "noise_scale": config.noise_scale,
            "noise_w": config.noise_w,
            "seed": 0,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def scales(self) -> np.ndarray:
        """float32 [3]: the order the graph reads them in."""
        return np.array([self.noise_scale, self.length_scale, self.noise_w], np.float32)


def make_noise(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal noise for one item, fixed by `seed`.

    Returns noise_phonemes float32 [2, NOISE_PHONEMES] and noise_frames float32
    [HIDDEN_CHANNELS, NOISE_FRAMES]; their lengths do not depend on the text, so an item's
    audio does not depend on the batch it is in.
    """
    rng = np.random.default_rng(seed)
    phonemes = rng.standard_normal((2, NOISE_PHONEMES), dtype=np.float32)
    frames = rng.standard_normal((HIDDEN_CHANNELS, NOISE_FRAMES), dtype=np.float32)
    return phonemes, frames


def batch_inputs(
    id_lists: Sequence[Sequence[int]], controls: Sequence[Controls], pad_to: int = 1
) -> dict[str, np.ndarray]:
    """Items -> the graph's inputs; ids padded with 0 to a multiple of `pad_to`.

    phoneme_ids int64 [B, L], phoneme_lengths int64 [B, 1], scales float32 [B, 3],
    noise_phonemes float32 [B, 2, n], noise_frames float32 [B, 192, m].
    """
    lengths = np.array([[len(ids)] for ids in id_lists], np.int64)
    width = int(-(-lengths.max() // pad_to) * pad_to)
    ids = np.zeros((len(id_lists), width), np.int64)
    for row, item in enumerate(id_lists):
        ids[row, : len(item)] = item
    noises = [make_noise(c.seed) for c in controls]
    return TTS_VITS.rows(
        phoneme_ids=ids,
        phoneme_lengths=lengths,
        scales=np.stack([c.scales for c in controls]),
        noise_phonemes=np.stack([n[0] for n in noises]),
        noise_frames=np.stack([n[1] for n in noises]),
    )


@dataclasses.dataclass(frozen=True)
class SentenceAudio:
    """One synthesized chunk: audio float32 [samples] and the timing of its phonemes.

    phonemes[k] is spoken from starts[k] to ends[k] (seconds from the chunk's start); the
    leading silence is '^' and the trailing one '$'; ends[-1] == len(audio) / sample_rate.
    """

    text: str
    audio: np.ndarray
    sample_rate: int
    phonemes: tuple[str, ...]
    starts: np.ndarray
    ends: np.ndarray


def phoneme_timings(
    chunk: Chunk, durations: np.ndarray, seconds_per_frame: float
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """Durations per id (frames, int [len(chunk.ids)]) -> (symbols, starts, ends) in seconds.

    Each PAD's frames go to the symbol before it, so the symbols are '^', the phonemes, '$'.
    """
    symbols = chunk.symbols
    if len(durations) < len(symbols):
        raise ValueError(f"{len(durations)} durations for {len(symbols)} ids")
    names: list[str] = []
    frames: list[int] = []
    for symbol, count in zip(symbols, durations[: len(symbols)].tolist(), strict=True):
        if symbol == "_" and names:
            frames[-1] += int(count)
        else:
            names.append(symbol)
            frames.append(int(count))
    ends = np.cumsum(frames, dtype=np.float64) * seconds_per_frame
    starts = np.concatenate([[0.0], ends[:-1]])
    return tuple(names), starts.astype(np.float32), ends.astype(np.float32)


def joined(pieces: Sequence[SentenceAudio], text: str) -> SentenceAudio:
    """Consecutive chunks of one text as one utterance: the audio concatenated, the phoneme
    times (float64 seconds) counted from the first chunk's start."""
    if not pieces:
        raise ValueError(f"no audio to join for {text!r}")
    offsets = np.cumsum([0.0] + [p.audio.size / p.sample_rate for p in pieces[:-1]])
    shifted = list(zip(pieces, offsets, strict=True))
    return SentenceAudio(
        text=text,
        audio=np.concatenate([p.audio for p in pieces]),
        sample_rate=pieces[0].sample_rate,
        phonemes=tuple(symbol for p in pieces for symbol in p.phonemes),
        starts=np.concatenate([p.starts.astype(np.float64) + o for p, o in shifted]),
        ends=np.concatenate([p.ends.astype(np.float64) + o for p, o in shifted]),
    )


class Synthesizer:
    """Text -> SentenceAudio per chunk, through an `infer` callable of the VITS graph."""

    def __init__(self, phonemizer: Phonemizer, infer: InferFn, pad_to: int = 64):
        self.phonemizer = phonemizer
        self.config = phonemizer.config
        self.infer = infer
        self.pad_to = pad_to

    def synthesize_chunks(self, chunks: Sequence[Chunk], controls: Controls) -> list[SentenceAudio]:
        """All chunks in one batch (each chunk with the same seed, as if alone)."""
        outputs = TTS_VITS.read_rows(
            self.infer(batch_inputs([c.ids for c in chunks], [controls] * len(chunks), self.pad_to))
        )
        return [self._result(c, outputs, row) for row, c in enumerate(chunks)]

    def stream(self, text: bytes | str, controls: Controls) -> Iterator[SentenceAudio]:
        """One chunk at a time (a sentence, or part of a long one), in order."""
        for chunk in prepare(text, self.phonemizer).chunks:
            yield from self.synthesize_chunks([chunk], controls)

    def _result(self, chunk: Chunk, outputs: Mapping[str, np.ndarray], row: int) -> SentenceAudio:
        length = int(outputs["audio_lengths"][row, 0])
        names, starts, ends = phoneme_timings(
            chunk, np.asarray(outputs["durations"][row]), self.config.seconds_per_frame
        )
        audio = np.ascontiguousarray(outputs["audio"][row, :length], dtype=np.float32)
        return SentenceAudio(chunk.text, audio, self.config.sample_rate, names, starts, ends)


def onnx_infer(session) -> InferFn:  # session: onnxruntime.InferenceSession
    """An InferFn over an ONNX Runtime session of the exported graph."""
    names = [o.name for o in session.get_outputs()]

    def infer(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, dict(inputs)), strict=True))

    return infer
