"""Does the avatar give its own name when asked? The share of replies to "What is your
name?" that contain the persona's name, over sessions and sampling seeds, for any chat
engine (the packaged decoder in process, or an OpenAI-compatible endpoint).

    python -m evals.persona --folder ARTIFACT [--endpoint URL] [--persona FILE]

ARTIFACT: the llm_decoder artifact folder (python -c "from export.registry import
ensure_all; print(ensure_all(['llm_decoder'])['llm_decoder'])"). Figures are printed,
never asserted here (tests/test_persona.py holds the floor).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from avatar.llm.engine import DEFAULT_PERSONA, ChatEngine, EngineConfig
from avatar.llm.persona import Persona, load_persona

log = logging.getLogger(__name__)

QUESTION = "What is your name?"
# the conversations the question is asked in: first thing, or after a greeting
OPENINGS: tuple[tuple[str, ...], ...] = ((), ("Hello!",), ("Hi, good evening.",))
EXAMPLE = Persona(
    "Zora",
    "the receptionist of the Harbour View Hotel",
    "warm and cheerful",
    ("You work at the front desk.", "You have worked at the hotel for five years."),
)


@dataclasses.dataclass(frozen=True)
class NameShare:
    said: int
    asked: int
    misses: tuple[str, ...]  # a few replies that did not say it

    @property
    def share(self) -> float:
        return self.said / max(1, self.asked)

    def describe(self) -> str:
        return f"{self.said}/{self.asked} ({100 * self.share:.0f} %)"


def persona_config(persona: Persona, **more) -> EngineConfig:
    """The engine's persona settings as the `llm` model makes them from a persona file."""
    return EngineConfig(
        persona=persona.system_prompt(), introduction=persona.introduction(), **more
    )


def says_name(reply: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", reply, re.IGNORECASE) is not None


def name_share(
    make_engine: Callable[[EngineConfig], ChatEngine],
    persona: EngineConfig,
    name: str,
    seeds: Sequence[int] = range(8),
    max_tokens: int = 40,
) -> NameShare:
    """Ask QUESTION in every opening with every seed (one session each), sampling as
    the engine's defaults say, with `persona` (EngineConfig's persona and introduction);
    count the replies that contain `name`."""
    engine = make_engine(persona)
    said, asked, misses = 0, 0, []
    for seed in seeds:
        for n, opening in enumerate(OPENINGS):
            session = f"name-{seed}-{n}"
            sampling = json.dumps({"seed": seed, "max_tokens": max_tokens})
            for turn in opening:
                _reply(engine, turn, session, sampling)
            reply = _reply(engine, QUESTION, session, sampling)
            asked += 1
            if says_name(reply, name):
                said += 1
            elif len(misses) < 5:
                misses.append(reply.strip())
    return NameShare(said, asked, tuple(misses))


def _reply(engine: ChatEngine, text: str, session: str, sampling: str) -> str:
    turn = json.dumps([{"role": "user", "content": text}])
    events = list(engine.chat(turn, session, sampling))
    if events[-1].finish_reason == "error":
        raise RuntimeError(f"the reply failed: {events[-1].error}")
    return "".join(c.text for e in events for c in e.chunks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folder", type=Path, help="the llm_decoder artifact folder")
    parser.add_argument("--endpoint", help="an OpenAI-compatible base URL")
    parser.add_argument("--persona", type=Path, help="a persona file (default: Zora)")
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    persona = load_persona(args.persona) if args.persona else EXAMPLE
    seeds = range(args.seeds)
    engines: list[tuple[str, Callable[[EngineConfig], ChatEngine]]] = []
    if args.folder:
        from avatar.llm.decoder import OrtDecoder
        from avatar.llm.tokenizer import Tokenizer

        def packaged(config: EngineConfig) -> ChatEngine:
            decoder = OrtDecoder(args.folder / "model.onnx", 1)
            return ChatEngine(decoder, Tokenizer(args.folder), config)

        engines.append(("packaged SmolLM2 (in process)", packaged))
    if args.endpoint:
        from avatar.llm.openai_api import Endpoint, OpenAIBackend

        def remote(config: EngineConfig) -> ChatEngine:
            return ChatEngine(OpenAIBackend(Endpoint(args.endpoint)), None, config)

        engines.append((f"endpoint {args.endpoint}", remote))
    ways = {
        "one-line persona": EngineConfig(persona=DEFAULT_PERSONA.replace("Mia", persona.name)),
        "persona file": persona_config(persona),
    }
    for label, make in engines:
        for how, config in ways.items():
            result = name_share(make, config, persona.name, seeds)
            print(f"{label}, {how}: says {persona.name!r} in {result.describe()}")
            for miss in result.misses[:3]:
                print(f"    e.g. {miss[:100]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
