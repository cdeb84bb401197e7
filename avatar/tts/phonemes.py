"""Text -> chunks of espeak-ng phonemes -> Piper phoneme ids.

The ids follow Piper's training exactly (`piper_phonemize.phoneme_ids_espeak`): BOS '^',
then PAD '_' after BOS and after every phoneme, then EOS '$'.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Sequence

from avatar.errors import RequestError
from avatar.sentences import split_sentences
from avatar.tts.normalize import MAX_CHARS, CleanText, clean, normalize
from avatar.tts.sentences import split_long
from avatar.tts.voice import BOS, EOS, PAD, VoiceConfig

log = logging.getLogger(__name__)

MAX_PHONEMES = 200  # per chunk; ~12 s of speech; ids = 2 * phonemes + 2
# espeak-ng keeps global state (voice, callbacks): every use of the library holds this
ESPEAK_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One unit of synthesis: a sentence, or part of a long one.

    `ids` has 2 * len(phonemes) + 2 entries: ids[0] is BOS, ids[2k + 1] are PADs, the phoneme
    phonemes[k] is at ids[2k + 2] (phonemes missing from the voice's map are skipped).
    """

    text: str
    phonemes: tuple[str, ...]
    ids: tuple[int, ...]

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbol of each id: ('^', '_', p0, '_', p1, '_', ..., '$')."""
        out = [BOS, PAD]
        for p in self.phonemes:
            out += [p, PAD]
        return (*out, EOS)


class Phonemizer:
    """espeak-ng phonemisation with the voice's phoneme-id map."""

    def __init__(self, config: VoiceConfig, max_phonemes: int = MAX_PHONEMES):
        if max_phonemes < 8:
            raise ValueError(f"max_phonemes={max_phonemes}: expected at least 8")
        self.config = config
        self.max_phonemes = max_phonemes

    def phonemize(self, text: str) -> list[str]:
        """Text -> phonemes (codepoints, with spaces and punctuation) of all its clauses."""
        from piper_phonemize import phonemize_espeak

        with ESPEAK_LOCK:
            sentences = phonemize_espeak(text, self.config.espeak_voice)
        out: list[str] = []
        for sentence in sentences:
            if sentence and out:
                out.append(" ")
            out.extend(sentence)
        return out

    def known(self, phonemes: Sequence[str], missing: Counter | None = None) -> list[str]:
        """The phonemes the voice has ids for (others are counted in `missing`)."""
        id_map = self.config.phoneme_id_map
        kept = [p for p in phonemes if p in id_map]
        if missing is not None and len(kept) != len(phonemes):
            missing.update(p for p in phonemes if p not in id_map)
        return kept

    def to_ids(self, phonemes: Sequence[str]) -> list[int]:
        """Phonemes (all in the map) -> ids: ^ _ p0 _ p1 _ ... $."""
        id_map = self.config.phoneme_id_map
        ids = [*id_map[BOS], *id_map[PAD]]
        for p in phonemes:
            ids += [*id_map[p], *id_map[PAD]]
        return [*ids, *id_map[EOS]]

    def chunk_sentence(self, sentence: str) -> list[Chunk]:
        """One sentence -> chunks of at most `max_phonemes` phonemes each (nothing dropped)."""
        missing: Counter = Counter()
        cache: dict[str, list[str]] = {}

        def phonemes_of(text: str) -> list[str]:
            if text not in cache:
                cache[text] = self.known(self.phonemize(text), missing)
            return cache[text]

        chunks = []
        for piece in split_long(sentence, lambda t: len(phonemes_of(t)), self.max_phonemes):
            phonemes = phonemes_of(piece)
            for start in range(0, len(phonemes), self.max_phonemes):  # one huge "word"
                part = tuple(phonemes[start : start + self.max_phonemes])
                chunks.append(Chunk(piece, part, tuple(self.to_ids(part))))
        if missing:
            log.warning("phonemes missing from the voice's map, skipped: %s", dict(missing))
        return [c for c in chunks if any(p.isalpha() for p in c.phonemes)]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A request's text, ready for the acoustic model."""

    cleaned: CleanText
    normalized: str
    chunks: tuple[Chunk, ...]


def prepare(data: bytes | str, phonemizer: Phonemizer, max_chars: int = MAX_CHARS) -> Prepared:
    """Request text -> checked, normalised text -> sentence chunks with phoneme ids.

    Raises RequestError for text that cannot be spoken (see `normalize.clean`).
    """
    cleaned = clean(data, max_chars)
    normalized = normalize(cleaned.text)
    chunks = [c for s in split_sentences(normalized) for c in phonemizer.chunk_sentence(s)]
    if not chunks:
        raise RequestError(
            f"text {normalized[:40]!r} gives no phonemes to speak: expected words in English"
        )
    return Prepared(cleaned, normalized, tuple(chunks))
