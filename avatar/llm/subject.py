"""Who a question asks about: the avatar, the user, or neither (what grounding reads beside it).

Words alone miss many ways of asking the avatar who it is (a question that says only
"you" may be about the venue's rules: "How old do you have to be?"), so a question that
addresses the avatar is judged by the served sentence embedding model (MiniLM, `emotion_encoder`):
its nearest prototype question, among questions about the avatar's name and role and
questions about the venue or small talk (`PROTOTYPES`, written from the development
split's kinds of question). The embedding judges *what* is asked, the pronoun *whose*:
MiniLM puts "Can you tell me your name?" as close to "What is my name?" as to "What is
your name?" (cosine 0.72 both), so a question counts as about the avatar only when it
also speaks to it (you, your, yours, yourself).

A question with no word of its own beside its pronoun ("And you?", "Yours?") asks the
avatar what the conversation was just about; it is about the avatar without a look-up.
The recogniser only chooses what the model reads; the model still writes every word.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Sequence

import numpy as np

from avatar.llm.grounding import Embed, content_words

log = logging.getLogger(__name__)

# the questions each subject is judged by (nearest prototype wins); written for the
# development split's kinds of question, never from the test split
PROTOTYPES: dict[str, tuple[str, ...]] = {
    "avatar": (
        "What is your name?",
        "What's your name?",
        "Sorry, what was your name again?",
        "Who are you?",
        "Who am I talking to?",
        "Who is this?",
        "What should I call you?",
        "Can you tell me your name?",
        "Introduce yourself.",
        "Tell me about yourself.",
        "What do you do here?",
        "What is your job?",
        "What is your role here?",
        "Do you work here?",
        "Are you the receptionist?",
    ),
    "neither": (
        "Where is the spa?",
        "How much does parking cost?",
        "What time is check-in?",
        "When is breakfast served?",
        "Who is the head chef of the restaurant?",
        "What is the name of the duty manager?",
        "How old do you have to be to use the spa?",
        "How long do you keep lost property?",
        "Do you have a pool?",
        "Can I bring my dog?",
        "How are you today?",
        "Are you busy today?",
        "Do you like music?",
        "Do you have kids?",
        "Tell me a joke.",
        "What's the weather like?",
        "What time is it?",
        "Can you recommend a book?",
    ),
}
# below this cosine to every prototype, a question is about neither (nothing read)
FLOOR = 0.45

_YOU = re.compile(r"\b(?:you|your|yours|yourself)\b", re.IGNORECASE)
_SENTENCE = re.compile(r"[^.!?]+[.!?]*")


def question_sentences(text: str) -> list[str]:
    """The sentences of a message that ask something (end in "?"), else its last one:
    "Nice to meet you, I'm Lena. And you?" -> ["And you?"]."""
    sentences = [s.strip() for s in _SENTENCE.findall(text) if s.strip()]
    asked = [s for s in sentences if s.endswith("?")]
    return asked or sentences[-1:]


def elliptic(sentence: str) -> bool:
    """A question with no word that states what it asks beside "you" ("And you?",
    "Yours?"): it asks the avatar what the conversation was just about."""
    return bool(_YOU.search(sentence)) and not content_words(sentence)


@dataclasses.dataclass
class SubjectJudge:
    """Judges whether a question asks about the avatar, by `embed` (texts -> vectors
    [N, D], the served MiniLM) against `PROTOTYPES`; their vectors are computed at the
    first question that needs them (through BLS the model answers only after start)."""

    embed: Embed
    floor: float = FLOOR
    _prototypes: tuple[np.ndarray, list[str]] | None = dataclasses.field(default=None, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def asks_the_avatar(self, question: str) -> bool:
        """Some sentence of `question` that speaks to the avatar asks who it is or what it
        does: elliptic, or nearest to an "avatar" prototype at `floor` or more."""
        addressed = [s for s in question_sentences(question) if _YOU.search(s)]
        if any(elliptic(s) for s in addressed):
            return True
        if not addressed:
            return False
        try:
            labels = self.nearest(addressed)
        except Exception:  # the embedding model failed (e.g. not loaded): the words decide
            log.warning("the question's subject is judged by its words only", exc_info=True)
            return False
        return any(label == "avatar" for label in labels)

    def nearest(self, sentences: Sequence[str]) -> list[str]:
        """Each sentence's subject: the label of its nearest prototype, or "neither" below
        `floor`."""
        vectors, labels = self._vectors()
        found = _unit(self.embed(list(sentences))) @ vectors.T
        best = found.argmax(axis=1)
        return [
            labels[i] if row[i] >= self.floor else "neither"
            for i, row in zip(best, found, strict=True)
        ]

    def _vectors(self) -> tuple[np.ndarray, list[str]]:
        with self._lock:
            if self._prototypes is None:
                labels = [label for label, texts in PROTOTYPES.items() for _ in texts]
                texts = [text for group in PROTOTYPES.values() for text in group]
                self._prototypes = _unit(self.embed(texts)), labels
            return self._prototypes


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, np.float64)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
