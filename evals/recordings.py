"""Real human recordings with transcripts that install offline, for judging ASR by WER.

Debian's `pocketsphinx-testdata` (installed by scripts/setup.sh): five LibriVox clips of
"Sense and Sensibility" (3-7 s, read speech) and five spoken card names ("ten of clubs",
1-3 s, close-talking), 16 kHz mono, with their reference transcripts. A few words in the
references are spoken disfluencies ("a more a amiable") and count as they are.
"""

from __future__ import annotations

import re
import wave
from pathlib import Path

import numpy as np

from evals.clips import Clip

TESTDATA = Path("/usr/share/pocketsphinx/test/data")
SETS = ("librivox", "cards")
_LINE = re.compile(r"<s>(.*)</s>\s*\((\S+)\)")


class MissingRecordingsError(RuntimeError):
    """The Debian package with the recordings is not installed."""


def _read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (16_000, 1, 2):
            raise ValueError(f"{path}: expected 16 kHz mono 16-bit PCM")
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    return pcm.astype(np.float32) / 32768.0


def human_clips(root: Path = TESTDATA, sets: tuple[str, ...] = SETS) -> list[Clip]:
    """Every transcribed recording of `sets`, in a fixed order."""
    if not root.is_dir():
        raise MissingRecordingsError(
            f"{root} is missing: install Debian's pocketsphinx-testdata (scripts/setup.sh does)"
        )
    out = []
    for name in sets:
        folder = root / name
        listing = next(folder.glob("*transcription"))
        for line in listing.read_text().splitlines():
            if match := _LINE.search(line):
                text, utterance = match.group(1).strip(), match.group(2)
                out.append(Clip(text, _read_wav(folder / f"{utterance}.wav")))
    return out
