"""Grounded decoding for a small model: the reply is pulled towards what it must repeat.

A 135M model given "Your name is Mia" still says "My name is Luna", and given "my code is
4417" two turns ago answers about coding. What it has to say is already in its prompt, in
three places: the persona (who it is), the user's own earlier words (what they told it),
and the operator's passages. `CopyBias` adds a bonus to the logit of the token that would
continue a span of those sources which the reply has just repeated, as pointer-style
decoders copy from their input: once the reply says "My name is", the source "My name is
Mia." makes " Mia" likelier; once it says "your code is", the user's "my code is 4417"
(turned to the second person) makes " 4" likelier, then "4", "1", "7".

The sources are written from the speaker's side: the persona's "You are Mia" becomes "I am
Mia", the user's "my code is 4417" becomes "your code is 4417", so the reply continues the
spans it would say itself. The model still chooses every token; nothing is canned.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from avatar.llm.template import Message

Embed = Callable[[list[str]], np.ndarray]  # texts -> sentence vectors [N, D]

# the user's words as the avatar would say them back ("my" -> "your")
_TO_SECOND = {
    "i": "you",
    "me": "you",
    "my": "your",
    "mine": "yours",
    "myself": "yourself",
    "am": "are",
    "i'm": "you're",
    "i've": "you've",
    "i'd": "you'd",
    "i'll": "you'll",
    "we": "you",
    "our": "your",
    "us": "you",
}
# the persona's "you" as the avatar says it of itself ("Your name is" -> "My name is")
_TO_FIRST = {
    "you": "I",
    "your": "my",
    "yours": "mine",
    "yourself": "myself",
    "are": "am",
    "you're": "I'm",
    "you've": "I've",
    "you'd": "I'd",
    "you'll": "I'll",
}
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
MAX_CANDIDATES = 8
AGREEMENTS = ("words", "embedding")
SUBJECTS = ("words", "embedding")


def _swap(text: str, table: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        word = match.group(0)
        swapped = table.get(word.lower())
        if swapped is None:
            return word
        # "I" is capital anywhere: the case follows the position, not the word
        before = text[: match.start()].rstrip()
        starts = not before or before[-1] in ".!?\"'"
        if starts or swapped.startswith("I"):
            return swapped[0].upper() + swapped[1:]
        return swapped

    return _WORD.sub(one, text)


def second_person(text: str) -> str:
    """The user's statement as the avatar says it back: "My code is 4417" -> "Your code is
    4417" ("am" follows "I" only in statements of this kind, so it becomes "are")."""
    return _swap(text, _TO_SECOND)


def first_person(text: str) -> str:
    """A persona's instruction as the avatar says it of itself: "You are Mia. Your name is
    Mia." -> "I am Mia. My name is Mia."."""
    return _swap(text, _TO_FIRST)


@dataclasses.dataclass(frozen=True)
class GroundingConfig:
    """How strongly replies are pulled to their sources (0: off). `bonus` is added to a
    logit (before temperature) per token of the longest span the reply repeats, up to
    `max_span` tokens; spans shorter than `min_span` are ignored."""

    bonus: float = 0.0
    min_span: int = 2
    max_span: int = 4
    persona: bool = True  # the persona's own words (name, role, facts)
    user: bool = True  # the user's earlier messages, in the second person
    passages: bool = True  # the operator's passages of this turn
    # what a question about someone reads beside it, in the form passages are read: about
    # the user ("what is my code?"), this many of their latest earlier messages (0: off);
    # about the avatar ("what is your name?"), the persona's statements about itself
    recall: int = 0
    recall_persona: bool = False
    # > 1: this many candidates of the reply's first sentence are decoded side by side
    # where it has sources, and the one that agrees best with them goes on (the others are
    # dropped); the extra ones sample at `candidate_temperature` at least (a greedy turn's
    # would all be the same). `agreement`: "words", the share of the candidate's content
    # words found in the sources; "embedding", its best cosine to a source sentence under
    # the engine's embedding model (EngineConfig.embed)
    candidates: int = 1
    candidate_temperature: float = 0.7
    agreement: str = "words"
    # "piece": judge them on the first piece the TTS would get (a first clause of
    # first_clause_words words may be one), sooner than on the whole first sentence
    choose_after: str = "sentence"
    # how a question's subject (the avatar, the user) is recognised: "words", by its
    # pronouns and a few phrases; "embedding", those words backed by the engine's
    # embedding model for questions that speak to "you" (avatar/llm/subject.py)
    subject: str = "words"

    @property
    def copies(self) -> bool:
        return self.bonus > 0

    @property
    def chooses(self) -> bool:
        return self.candidates > 1

    @property
    def embeds(self) -> bool:
        """Whether the engine needs the sentence embedding model (EngineConfig.embed)."""
        return self.subject == "embedding" or (self.chooses and self.agreement == "embedding")

    @classmethod
    def from_json(cls, text: str) -> GroundingConfig:
        """The `llm` model's `grounding` parameter (a JSON object of these fields);
        ValueError naming what is wrong."""
        data = json.loads(text or "{}")
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) - set(fields):
            raise ValueError(f"grounding must be a JSON object of {sorted(fields)}, got {text!r}")
        config = cls(**data)
        if config.bonus < 0 or config.recall < 0 or not 1 <= config.min_span <= config.max_span:
            raise ValueError(
                f"grounding {text!r}: bonus and recall must be >= 0, 1 <= min_span <= max_span"
            )
        if not 1 <= config.candidates <= MAX_CANDIDATES or config.candidate_temperature <= 0:
            raise ValueError(
                f"grounding {text!r}: candidates must be in [1, {MAX_CANDIDATES}] and "
                "candidate_temperature > 0"
            )
        if config.agreement not in AGREEMENTS or config.choose_after not in ("sentence", "piece"):
            raise ValueError(
                f"grounding {text!r}: agreement must be one of {AGREEMENTS}, choose_after "
                '"sentence" or "piece"'
            )
        if config.subject not in SUBJECTS:
            raise ValueError(f"grounding {text!r}: subject must be one of {SUBJECTS}")
        return config


# the question is about the user (they speak of themselves) / about the avatar
_ABOUT_THE_USER = re.compile(r"\b(?:my|me|mine|i|i'm|myself)\b", re.IGNORECASE)
# ("you" alone is not enough: "how old do you have to be" asks about the venue's rules)
_ABOUT_THE_AVATAR = re.compile(
    r"\b(?:your|yours|yourself|who are you|call you|about you|you do|talking to)\b"
    r"|\byou\b.*\bname\b|\bname\b.*\byou\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?]+[.!?]*")


@dataclasses.dataclass(frozen=True)
class About:
    """Whom the last message asks about (both, or neither, may be true)."""

    avatar: bool = False
    user: bool = False


def asks_about(question: str, asks_the_avatar: Callable[[str], bool] | None = None) -> About:
    """Whom `question` asks about, by its words; `asks_the_avatar` (a judge of the question,
    avatar/llm/subject.py) is asked when the words do not say it is the avatar."""
    avatar = bool(_ABOUT_THE_AVATAR.search(question))
    if not avatar and asks_the_avatar is not None:
        avatar = asks_the_avatar(question)
    return About(avatar, bool(_ABOUT_THE_USER.search(question)))


def _about(messages: Sequence[Message], about: About | None) -> About:
    if about is not None:
        return about
    return asks_about(messages[-1].content) if messages else About()


def persona_statements(system_prompt: str) -> str:
    """The persona's sentences about the avatar itself, in the first person ("You are Mia,
    the receptionist." -> "I am Mia, the receptionist."); instructions are left out."""
    found = []
    for sentence in _SENTENCE.findall(system_prompt):
        if re.match(r"(?:you|your)\b", sentence.strip(), re.IGNORECASE):
            found.append(first_person(sentence.strip()))
    return " ".join(found)


def recalled(
    messages: Sequence[Message], config: GroundingConfig, about: About | None = None
) -> str:
    """What the last message should read beside it: when it asks about the user, their
    latest earlier messages in the second person ("What is my code?" -> "Your code is
    4417."); when it asks about the avatar, the persona's statements about itself.
    `about`: whom it asks about (default: judged by its words, `asks_about`)."""
    question = messages[-1] if messages else None
    if question is None or question.role != "user":
        return ""
    parts = []
    about = _about(messages, about)
    if config.recall_persona and messages[0].role == "system" and about.avatar:
        parts.append(persona_statements(messages[0].content))
    if config.recall and about.user:
        # what they said of themselves, not what they asked
        earlier = [
            m.content
            for m in messages[:-1]
            if m.role == "user" and not m.content.rstrip().endswith("?")
        ]
        parts += [second_person(text) for text in earlier[-config.recall :]]
    return " ".join(part for part in parts if part)


def sources(
    messages: Sequence[Message],
    config: GroundingConfig,
    *,
    context: str = "",
    about: About | None = None,
) -> tuple[str, ...]:
    """What a reply to `messages` may copy from: the system prompt in the first person when
    the last message asks about the avatar, the user's earlier messages in the second
    person when it asks about the user, and the passages."""
    found: list[str] = []
    about = _about(messages, about)
    # the persona and the user's words only when the question asks about them: copied into
    # an answer about the spa's prices, "I am Mia, the receptionist" runs on by itself
    if config.persona and messages[0].role == "system" and about.avatar:
        found.append(first_person(messages[0].content))
    if config.user and about.user:
        earlier = [m for m in messages[:-1] if m.role == "user"]
        found += [second_person(m.content) for m in earlier]
    if config.passages and context.strip():
        found.append(context.strip())
    return tuple(found)


class CopyBias:
    """The copy bonus for one generation, over token-id sources. The reply is the tokens
    after `prompt_tokens` of the history the sampler sees."""

    def __init__(
        self, sources: Sequence[Sequence[int]], config: GroundingConfig, prompt_tokens: int
    ):
        self.config, self.prompt_tokens = config, prompt_tokens
        # span (as a tuple of ids) -> the tokens that follow it somewhere in a source
        self.next: defaultdict[tuple[int, ...], set[int]] = defaultdict(set)
        for ids in sources:
            for length in range(config.min_span, config.max_span + 1):
                for start in range(len(ids) - length):
                    self.next[tuple(ids[start : start + length])].add(ids[start + length])

    def apply(self, scores: np.ndarray, history: Sequence[int]) -> None:
        """Add the bonus in place: for the longest span the reply's end repeats, to each
        token that continues it (bonus x span length)."""
        reply = history[self.prompt_tokens :]
        for length in range(min(self.config.max_span, len(reply)), self.config.min_span - 1, -1):
            following = self.next.get(tuple(reply[-length:]))
            if following:
                ids = np.fromiter(following, np.int64)
                scores[ids] += self.config.bonus * length
                return


# words that carry no fact: a candidate is judged by the others ("name", "Mia", "4417")
_FUNCTION_WORDS = frozenset(
    str.split(
        """a an the and or but if so of to in on at by for with from as into about than then
    is are was were be been being am do does did have has had will would can could shall
    should may might must i me my mine you your yours we us our he him his she her it its
    they them their this that these those there here what which who whom whose when where
    why how not no yes oh well sure just also very really too please thank thanks hello hi
    let i'm you're it's that's i'd i'll i've you've we're there's here's what's"""
    )
)
_CONTENT = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+(?:[.,:]\d+)*")


def content_words(text: str) -> list[str]:
    """The words of `text` that can state a fact: names, nouns, figures (lower case)."""
    words = (w.lower() for w in _CONTENT.findall(text))
    return [w for w in words if w not in _FUNCTION_WORDS]


def word_agreement(candidate: str, sources: Sequence[str]) -> float:
    """The share of the candidate's content words found in the sources, as a pointer-style
    decoder would count copied words (0 when it has none)."""
    said = content_words(candidate)
    if not said:
        return 0.0
    known = set(content_words(" ".join(sources)))
    return sum(word in known for word in said) / len(said)


def embedding_agreement(
    candidates: Sequence[str], sources: Sequence[str], embed: Embed
) -> list[float]:
    """Each candidate's highest cosine to a sentence of the sources, under `embed` (the
    served sentence embedding model: texts -> vectors [N, D]), in one call."""
    pieces = [s for source in sources for s in _SENTENCE.findall(source) if s.strip()]
    if not pieces or not candidates:
        return [0.0] * len(candidates)
    vectors = np.asarray(embed([*candidates, *pieces]), np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
    cosines = vectors[: len(candidates)] @ vectors[len(candidates) :].T
    return [float(row.max()) for row in cosines]
