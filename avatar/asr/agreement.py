"""Transcribing while the user speaks: what successive passes over the growing audio agree on.

A live caller transcribes the speech so far every second or so. Two passes whose audio ends at
different times rarely agree on a wrong word, so the tokens both begin with are kept
(`common_prefix`, the caller's side: token ids only, no vocabulary), less their last word,
which both passes may have heard cut short (`whole_words`, the server's side). The next pass,
and the one at the end of speech, start from that prefix: it goes into the decoder with the
prompt in one step, and only the rest of the utterance is decoded token by token
(LocalAgreement, as whisper_streaming commits text; `python -m perf asr-prefix` measures the
word error rate and the time it saves).
"""

from __future__ import annotations

from collections.abc import Sequence

from avatar.asr.vocab import WhisperVocab
from avatar.errors import RequestError

# at most half of Whisper's 448-position text context goes in as a prefix, as its prompt
MAX_PREFIX_TOKENS = 112


def common_prefix(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """The tokens two transcripts (token ids as the `asr` model returns them) begin with."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return [int(t) for t in a[:n]]


def whole_words(tokens: Sequence[int], vocab: WhisperVocab) -> list[int]:
    """`tokens` without their last word (and the pieces of it), ending where a word began.

    Timestamps are kept up to the last text token kept: a prefix must not close a segment
    whose text it cut."""
    kept = list(tokens)
    while kept and kept[-1] >= vocab.timestamp_begin:  # trailing timestamps
        kept.pop()
    while kept and kept[-1] < vocab.timestamp_begin and not vocab.word_start(kept[-1]):
        kept.pop()  # the pieces after the last word's first token
    if kept and kept[-1] < vocab.timestamp_begin:
        kept.pop()  # that first token
    return kept


def check_prefix(tokens: Sequence[int], vocab: WhisperVocab) -> list[int]:
    """A caller's prefix as token ids, or RequestError saying what is wrong with it."""
    ids = [int(t) for t in tokens]
    if len(ids) > MAX_PREFIX_TOKENS:
        raise RequestError(f"prefix has {len(ids)} tokens; at most {MAX_PREFIX_TOKENS}")
    last = vocab.timestamp_begin + 1500  # <|30.00|>
    bad = [t for t in ids if not (0 <= t < vocab.eot or vocab.timestamp_begin <= t <= last)]
    if bad:
        raise RequestError(
            f"prefix has ids that are not text or timestamp tokens: {bad[:5]}; send the "
            "`tokens` of an earlier transcript of the same speech"
        )
    if ids and ids[0] < vocab.timestamp_begin:
        raise RequestError("prefix must begin with a timestamp token, as `tokens` does")
    return ids
