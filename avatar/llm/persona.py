"""The persona an operator owns: who the avatar is (name, role, manner, facts about itself),
read from a small TOML or JSON file and rendered into the system prompt.

    # persona.toml (docs/llm.md)
    name = "Mia"
    role = "the receptionist of the Harbour View Hotel"
    manner = "warm and cheerful"
    facts = ["You work at the front desk, day shift.", "You speak English and Italian."]

`avatar serve --persona FILE`, the `llm` model's `persona_file` parameter, or
$AVATAR_PERSONA_FILE choose one; else the `persona` parameter's plain text, else DEFAULT
(the packaged avatar, Mia). The rendering states the name twice; what the model reads of
it when asked who it is, and how its name is kept in the reply, is avatar/llm/grounding.py
(docs/llm.md has the measured shares).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PERSONA_FILE_ENV = "AVATAR_PERSONA_FILE"
MAX_FIELD_CHARS = 600
MAX_FACTS = 32
KEYS = ("name", "role", "manner", "facts")


class PersonaError(ValueError):
    """A persona file that cannot be used: the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Persona:
    name: str
    role: str = ""  # "the receptionist of the Harbour View Hotel"
    manner: str = ""  # "warm and cheerful"
    facts: tuple[str, ...] = ()  # about itself, each a sentence

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise PersonaError("a persona needs a name")
        for key in ("name", "role", "manner", *(f"facts[{i}]" for i in range(len(self.facts)))):
            value = self.facts[int(key[6:-1])] if key.startswith("facts[") else getattr(self, key)
            if len(value) > MAX_FIELD_CHARS:
                raise PersonaError(
                    f"persona {key} has {len(value)} characters (max {MAX_FIELD_CHARS})"
                )
        if len(self.facts) > MAX_FACTS:
            raise PersonaError(f"persona has {len(self.facts)} facts (max {MAX_FACTS})")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "persona") -> Persona:
        unknown = sorted(set(data) - set(KEYS))
        if unknown:
            raise PersonaError(f"{where}: unknown keys {unknown}; known: {list(KEYS)}")
        for key in ("name", "role", "manner"):
            if key in data and not isinstance(data[key], str):
                raise PersonaError(f"{where}: {key} must be a string")
        facts = data.get("facts", [])
        if isinstance(facts, str):
            facts = [facts]
        if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
            raise PersonaError(f"{where}: facts must be a list of strings")
        try:
            return cls(
                str(data.get("name", "")).strip(),
                str(data.get("role", "")).strip(),
                str(data.get("manner", "")).strip(),
                tuple(f.strip() for f in facts if f.strip()),
            )
        except PersonaError as error:
            raise PersonaError(f"{where}: {error}") from None

    def system_prompt(self) -> str:
        """The persona as a system prompt, in the second person (as chat models are
        instructed)."""
        name = self.name
        lines = [f"You are {name}" + (f", {self.role}." if self.role else ".")]
        lines.append(f"Your name is {name}.")
        if self.manner:
            lines.append(f"You are {self.manner.rstrip('.')}.")
        lines += [_sentence(fact) for fact in self.facts]
        # no "when someone asks your name, answer ..." rule: on the benchmark the small
        # model then answered "Mia, the receptionist..." to questions about the spa
        lines.append("Answer in one to three short spoken sentences.")
        return " ".join(lines)


# the packaged avatar (the `llm` model's default persona)
DEFAULT = Persona("Mia", "a warm and cheerful receptionist avatar")


def _sentence(text: str) -> str:
    return text if text[-1] in ".!?" else text + "."


def load_persona(path: str | Path) -> Persona:
    """A persona from a `.toml` or `.json` file; PersonaError saying what is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise PersonaError(f"persona file {path}: {error.strerror}") from None
    data: Any
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise PersonaError(f"persona file {path}: not valid JSON: {error}") from None
    elif path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise PersonaError(f"persona file {path}: TOML needs Python 3.11; use JSON") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise PersonaError(f"persona file {path}: not valid TOML: {error}") from None
    else:
        raise PersonaError(f"persona file {path}: expected a .toml or .json file")
    if not isinstance(data, dict):
        raise PersonaError(f"persona file {path}: expected a table/object of {list(KEYS)}")
    return Persona.from_mapping(data, f"persona file {path}")
