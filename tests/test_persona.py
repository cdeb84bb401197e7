"""The operator's persona (avatar/llm/persona.py): the file format, its rendering into
the system prompt, how the engine and `avatar serve` use it, and (slow) the share of
replies that give the persona's name with the packaged model (python -m perf says)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from avatar.llm.backend import Reply, ReplyBackend
from avatar.llm.engine import ChatEngine, EngineConfig
from avatar.llm.persona import Persona, PersonaError, load_persona
from avatar.llm.scheduler import Event
from avatar.llm.stream import Chunk
from avatar.llm.template import Message
from evals.grounding import states

TOML = """
name = "Zora"
role = "the receptionist of the Harbour View Hotel"
manner = "warm and cheerful"
facts = ["You work at the front desk", "You have worked here for five years."]
"""


def test_a_toml_persona_renders_its_name_role_manner_and_facts(tmp_path: Path):
    path = tmp_path / "persona.toml"
    path.write_text(TOML)
    persona = load_persona(path)
    assert persona.name == "Zora" and len(persona.facts) == 2
    prompt = persona.system_prompt()
    assert prompt.startswith("You are Zora, the receptionist of the Harbour View Hotel.")
    assert "Your name is Zora." in prompt and "You are warm and cheerful." in prompt
    assert "You work at the front desk." in prompt
    # the same in JSON
    (tmp_path / "p.json").write_text(json.dumps({"name": "Zora", "facts": "One fact"}))
    assert load_persona(tmp_path / "p.json").facts == ("One fact",)


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("p.toml", 'role = "x"', "needs a name"),
        ("p.toml", 'name = "A"\nage = 3', "unknown keys ['age']"),
        ("p.toml", 'name = "A"\nfacts = [1]', "facts must be a list of strings"),
        ("p.toml", "name = ", "not valid TOML"),
        ("p.json", "[]", "expected a table/object"),
        ("p.yaml", "name: A", "expected a .toml or .json file"),
        ("p.toml", f'name = "{"x" * 700}"', "max 600"),
    ],
)
def test_bad_persona_files_say_what_is_wrong(tmp_path: Path, name: str, text: str, words: str):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PersonaError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_persona(path)
    with pytest.raises(PersonaError, match="persona file"):
        load_persona(tmp_path / "missing.toml")


class Echo(ReplyBackend):
    """Answers every reply with one sentence; records what it was sent."""

    name = "echo"

    def __init__(self) -> None:
        self.sent: list[list[Message]] = []

    def submit(self, reply: Reply) -> None:
        self.sent.append(reply.messages)
        reply.emit(Event([Chunk("Fine.", "Fine.")], "stop", {}))


def test_a_callers_own_system_message_replaces_the_persona():
    backend = Echo()
    persona = Persona("Zora", "the receptionist")
    engine = ChatEngine(backend, None, EngineConfig(persona=persona.system_prompt()))
    hello = json.dumps([{"role": "user", "content": "Hello"}])
    list(engine.chat(hello, "s1"))
    list(engine.chat(hello, "s1"))
    first, second = backend.sent
    assert [m.role for m in first] == ["system", "user"]
    assert first[0].content == persona.system_prompt()
    assert [m.role for m in second] == ["system", "user", "assistant", "user"]
    own = json.dumps(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    list(engine.chat(own, ""))
    assert [m.role for m in backend.sent[-1]] == ["system", "user"]


def test_the_name_counts_as_a_word_only():
    assert states("My name is zora.", ["Zora"]) and not states("I am Zorana.", ["Zora"])


def test_serve_checks_the_persona_and_endpoint_before_starting(tmp_path: Path):
    from serving.cli import _llm_environment

    path = tmp_path / "persona.toml"
    path.write_text(TOML)
    args = argparse.Namespace(llm="http://127.0.0.1:8080/v1", llm_model="smollm2", persona=path)
    env = _llm_environment(args)
    assert env == {
        "AVATAR_LLM_URL": "http://127.0.0.1:8080/v1",
        "AVATAR_LLM_MODEL": "smollm2",
        "AVATAR_PERSONA_FILE": str(path.resolve()),
    }
    with pytest.raises(ValueError, match="expected http"):
        _llm_environment(argparse.Namespace(llm="127.0.0.1:8080", llm_model="", persona=None))
    path.write_text('role = "x"')
    with pytest.raises(PersonaError):
        _llm_environment(argparse.Namespace(llm=None, llm_model="", persona=path))


@pytest.mark.slow
def test_the_packaged_model_gives_its_own_name():
    """docs/llm.md's figure, its development split: `python -m perf says --benchmarks name`."""
    from perf.says import run_benchmarks

    result = run_benchmarks("dev", ("name",), ("served",), seeds=1)["rows"]["served"]["name"]
    assert result["share"] >= 0.5, result["misses"]
