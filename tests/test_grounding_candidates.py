"""Candidates of the first sentence (avatar/llm/scheduler.py `Choice`, grounding's
`candidates`): decoded side by side on the packaged SmolLM2, the one that agrees with the
sources goes on, the others leave nothing behind. `python -m perf says --variants served
+candidates` measures what it changes in replies (docs/llm.md)."""

from __future__ import annotations

import dataclasses
import json
import queue
from pathlib import Path

import pytest

from avatar.llm.decoder import OrtDecoder
from avatar.llm.engine import ChatEngine, EngineConfig
from avatar.llm.grounding import (
    GroundingConfig,
    content_words,
    embedding_agreement,
    first_person,
    word_agreement,
)
from avatar.llm.persona import DEFAULT
from avatar.llm.scheduler import Event
from avatar.llm.sequences import KvCacheSequences
from avatar.llm.tokenizer import Tokenizer
from avatar.sentences import split_sentences

SERVED = GroundingConfig(bonus=1.5, recall=4, recall_persona=True)


@pytest.fixture(scope="module")
def model():
    from serving.served import served_onnx

    path = Path(served_onnx("llm_decoder"))
    return OrtDecoder(path), Tokenizer(path.parent)


def _engine(model, **grounding) -> ChatEngine:
    decoder, tokenizer = model
    config = EngineConfig(grounding=dataclasses.replace(SERVED, **grounding))
    return ChatEngine(decoder, tokenizer, config)


def _ask(engine: ChatEngine, question: str, seed: int, temperature: float = 0.7):
    turn = json.dumps([{"role": "user", "content": question}])
    sampling = json.dumps({"seed": seed, "temperature": temperature, "max_tokens": 40})
    events = list(engine.chat(turn, "", sampling))
    return "".join(c.text for e in events for c in e.chunks), events[-1]


def _held(engine: ChatEngine) -> int:
    decoder = engine.scheduler.decoder
    assert isinstance(decoder, KvCacheSequences)
    return len(decoder)


def test_agreement_counts_the_words_that_state_facts():
    persona = [first_person(DEFAULT.system_prompt())]
    assert content_words("Hi! My name is Mia, and I'm 25.") == ["name", "mia", "25"]
    assert word_agreement("My name is Mia.", persona) == 1.0
    assert word_agreement("My name is Luna.", persona) == 0.5
    assert word_agreement("Hello there!", persona) == 0.0
    told = ["Your code is 4417."]
    assert word_agreement("Your code is 4417.", told) > word_agreement("I love coding!", told)

    def embed(texts):  # one call for all: candidates first, then the sources' sentences
        import numpy as np

        return np.array([[1.0, 0.0] if "Mia" in t else [0.0, 1.0] for t in texts])

    assert embedding_agreement(["I am Mia.", "I am Luna."], ["I am Mia. Hi."], embed) == [
        1.0,
        1.0,  # "Hi." is the second source sentence: Luna is as close to it as Mia to Mia
    ]


def test_the_candidates_setting_is_checked():
    config = GroundingConfig.from_json('{"candidates": 3, "agreement": "embedding"}')
    assert config.chooses and config.agreement == "embedding"
    assert not GroundingConfig().chooses  # off by default: one reply, as before
    for bad in ('{"candidates": 0}', '{"candidates": 9}', '{"agreement": "vibes"}'):
        with pytest.raises(ValueError, match="grounding"):
            GroundingConfig.from_json(bad)
    bad = '{"candidates": 2, "candidate_temperature": 0}'
    with pytest.raises(ValueError, match="candidate_temperature"):
        GroundingConfig.from_json(bad)


def test_the_chosen_candidate_agrees_at_least_as_well_as_the_reply_alone(model):
    """Greedy turns: the first candidate is the reply decoded alone, so the chosen one's
    first sentence never agrees less with the persona than it; the batch really holds the
    candidates, and every sequence is closed afterwards."""
    sources = [first_person(DEFAULT.system_prompt())]
    alone = _engine(model)
    chooser = _engine(model, candidates=3)
    for seed, question in enumerate(("What is your name?", "Who are you?")):
        single, end = _ask(alone, question, seed, temperature=0.0)
        assert "candidates" not in end.stats
        chosen, end = _ask(chooser, question, seed, temperature=0.0)
        assert end.finish_reason in ("stop", "length") and end.stats["candidates"] == 3
        first = split_sentences(chosen)[0]
        assert word_agreement(first, sources) >= word_agreement(split_sentences(single)[0], sources)
        if end.stats["chosen"] == 0:
            assert chosen == single
    scheduler = chooser.scheduler
    assert scheduler.batch_rows / scheduler.steps > 1.5  # candidates shared decode steps
    assert _held(chooser) == 0
    # nothing to agree with (a question about neither of them, no passages): one reply
    _, end = _ask(chooser, "Tell me a joke.", 0)
    assert "candidates" not in end.stats


def test_a_reply_cancelled_among_its_candidates_ends_once_and_frees_them(model):
    engine = _engine(model, candidates=3)
    turn = json.dumps([{"role": "user", "content": "What is your name?"}])
    events: queue.Queue[Event] = queue.Queue()
    stop = {"now": False}
    engine.submit(engine.parse(turn, "", '{"seed": 1}'), events.put, lambda: stop["now"])
    engine.backend.step()  # started: the candidates decode, nothing is said yet
    assert events.empty()
    stop["now"] = True
    engine.backend.run_until_idle()
    finals = [e for e in list(events.queue) if e.finish_reason is not None]
    assert [e.finish_reason for e in finals] == ["cancelled"]
    assert _held(engine) == 0


def test_candidates_judged_by_the_embedding_model_or_on_the_first_piece(model):
    """The served MiniLM chooses (the `embedding` agreement); judged on the first piece
    for TTS, a reply still ends whole; without the model the first candidate goes on."""
    from perf.says import _embedding_model

    decoder, tokenizer = model
    grounding = dataclasses.replace(SERVED, candidates=3, agreement="embedding")
    config = EngineConfig(grounding=grounding, embed=_embedding_model())
    _, end = _ask(ChatEngine(decoder, tokenizer, config), "What is your name?", 2)
    assert end.stats["candidates"] == 3
    piece = dataclasses.replace(grounding, choose_after="piece")
    config = EngineConfig(grounding=piece, embed=_embedding_model(), first_clause_words=4)
    text, end = _ask(ChatEngine(decoder, tokenizer, config), "Who are you?", 3)
    assert end.stats["candidates"] == 3 and text.strip()
    blind = ChatEngine(decoder, tokenizer, EngineConfig(grounding=grounding))  # no embed
    _, end = _ask(blind, "What is your name?", 2)
    assert end.stats["chosen"] == 0 and _held(blind) == 0
