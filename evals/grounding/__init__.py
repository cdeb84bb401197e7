"""What the avatar says, judged by the facts it must get right: its own name and role, what
the user told it earlier in the conversation, and the operator's documents.

Three sets, each with a development split (settings were chosen on it) and a test split
(written before any setting was tried, read only for the report):

- `persona.json`: "What is your name?" and its kin, after a few openings, for the served
  default persona and for a persona file per split;
- `user_facts.json`: a fact told (a name, a number, a preference), 1-3 turns of other talk,
  then the question that needs it;
- evals/knowledge/: the hotel's documents and questions (dev), the museum's (test).

A reply states a fact when one of its expected phrases appears as words (case-insensitive,
a plural allowed), so "peanuts" states "peanut" but "maybe" does not state "may". The
runner is `python -m perf says` (perf/says.py); it prints figures and asserts nothing.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KNOWLEDGE = HERE.parent / "knowledge"
SPLITS = ("dev", "test")
# the documents and questions of each split
VENUES = {
    "dev": (KNOWLEDGE / "venue", KNOWLEDGE / "questions.json"),
    "test": (KNOWLEDGE / "test_venue", KNOWLEDGE / "test_questions.json"),
}


def states(reply: str, phrases: Sequence[str]) -> bool:
    """One of `phrases` is in `reply` as whole words (case-insensitive; a plural -s/-es)."""
    return any(
        re.search(rf"(?<!\w){re.escape(p.lower())}(?:e?s)?(?!\w)", reply.lower()) for p in phrases
    )


@dataclasses.dataclass(frozen=True)
class Conversation:
    """Say `turns` in one new conversation; the reply to the last must state `expect`."""

    turns: tuple[str, ...]
    expect: tuple[str, ...]
    kind: str  # "name", "role", "fact", "document"

    @property
    def question(self) -> str:
        return self.turns[-1]


@dataclasses.dataclass(frozen=True)
class PersonaSet:
    persona: dict[str, Any]  # a persona file's fields (avatar.llm.persona.Persona)
    default: list[Conversation]  # the questions for the served default persona
    own: list[Conversation]  # the same questions for `persona`


@cache
def _load(name: str) -> Any:
    return json.loads((HERE / name).read_text(encoding="utf-8"))


def persona_set(split: str, default_name: str) -> PersonaSet:
    """The name and role questions of `split`, for the default persona (named
    `default_name`) and for the split's persona file."""
    data = _load("persona.json")
    persona = dict(data["personas"][split])
    role_words = tuple(persona.pop("role_words"))

    def conversations(name: str, roles: Sequence[str]) -> list[Conversation]:
        return [
            Conversation(
                (*q["openings"], q["ask"]),
                (name,) if q["expect"] == "name" else tuple(roles),
                q["expect"],
            )
            for q in data["questions"][split]
        ]

    return PersonaSet(
        persona,
        conversations(default_name, data["default_role_words"]),
        conversations(persona["name"], role_words),
    )


def user_facts(split: str) -> list[Conversation]:
    """The user's facts of `split`: told, other talk, then asked for."""
    return [
        Conversation((c["tell"], *c["between"], c["ask"]), tuple(c["expect"]), "fact")
        for c in _load("user_facts.json")[split]
    ]


def documents(split: str) -> tuple[Path, list[Conversation]]:
    """The venue folder of `split` and its questions (one each, in a new conversation)."""
    folder, questions = VENUES[split]
    items = json.loads(questions.read_text(encoding="utf-8"))
    return folder, [Conversation((q["question"],), tuple(q["expect"]), "document") for q in items]
