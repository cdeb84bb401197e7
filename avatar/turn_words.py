"""End of turn by the words (Triton-free): the `turn_words` model's input.

The served model (export/turn_words/recipe.py) is a logistic regression over hashed
features of the words so far, trained here on the packaged conversations (whole messages
against the same messages cut at a word): it answers the probability that the words are a
finished turn. It reads the words only: case and punctuation are dropped first, so
Whisper's habit of ending a fragment ("Can you tell me.") with a full stop tells it
nothing. Its features lean on the end of the text (the last one to three words, the word
before the last) and on the word the turn opened with ("what ... does", "can ... me"), because
that is where an unfinished turn shows: a verb still waiting for its object, a preposition,
an article, an opener with no verb yet.

`features(text)` is computed by the caller (the gateway, like `turn_features` for the
audio); the model sums one learned weight per feature.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

BUCKETS = 1 << 18  # the hashed feature space (a weight each: 1 MiB of float32)
START = "<s>"  # pads the front of short texts, so "tell me" and "you tell me" differ
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_LENGTHS = (1, 2, 3, 4, 6, 9, 14)  # word-count buckets: 1, 2, 3, 4, 5-6, 7-9, 10-14, 15+
CONTENT = "·"  # any word not below: a noun, verb or adjective the training data may never have
# English's closed classes (articles, determiners, prepositions, conjunctions, pronouns,
# auxiliaries, fillers), kept as themselves in the shape features: "call me a taxi" ends
# like "a ·", which generalises to nouns the conversations never ended on.
_FUNCTION_WORDS = """
a an the this that these those my your his her its our their some any no every each all
both what which whose whatever to of in on at by for with about against between into
through during before after above below from up down out off over under than as like near
without within along across behind around among upon toward towards via and or but nor so
yet because although though while if unless until since whether when where how why who
whom i you he she it we they me him us them is am are was were be been being have has had
do does did can could will would shall should may might must not dont doesnt didnt cant
wont isnt arent wasnt im youre hes shes were theyre ive youve id youd ill youll thats
theres whats hows wheres um uh er hmm erm very really just also then there here please
"""
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())


def words(text: str) -> list[str]:
    """The words of `text`, lower case, without punctuation; apostrophes joined ("I'm" ->
    "im", as the training conversations write it)."""
    return _WORD.findall(text.lower().replace("'", "").replace("\u2019", ""))


def _length(n: int) -> str:
    return str(sum(n > edge for edge in _LENGTHS))


def feature_names(text: str) -> list[str]:
    """The named features of `text` (fixed count: FEATURES); [] when it has no words."""
    w = words(text)
    if not w:
        return []
    padded = [START] * 2 + w
    last, first, size = padded[-3:], w[0], _length(len(w))
    shape = [x if x in FUNCTION_WORDS or x == START else CONTENT for x in last]
    # chosen on held-out conversations (export/turn_words/recipe.py): longer n-grams and
    # more opener features fit the training turns better and the held-out ones worse
    return [
        f"l1={last[2]}",
        f"l2={' '.join(last[1:])}",
        f"l3={' '.join(last)}",
        f"p2={last[1]}",
        f"f1={first}",
        f"f1l1={first}|{last[2]}",
        f"n={size}",
        f"l1n={last[2]}|{size}",
        f"s2={' '.join(shape[1:])}",
        f"s3={' '.join(shape)}",
    ]


FEATURES = len(feature_names("a"))


def features(text: str) -> np.ndarray | None:
    """[FEATURES] int64: the model's input for `text`; None when it has no words (nothing
    to judge: the caller goes by the audio alone)."""
    names = feature_names(text)
    if not names:
        return None
    return np.array([zlib.crc32(n.encode()) % BUCKETS for n in names], np.int64)
