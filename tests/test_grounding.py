"""Grounded decoding (avatar/llm/grounding.py): sources written from the speaker's side, the
copy bias on the packaged model's own tokens, and what the engine gives a reply to copy.
The benchmark (python -m perf says) measures what it changes in replies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from avatar.llm.backend import Reply, ReplyBackend
from avatar.llm.engine import ChatEngine, EngineConfig
from avatar.llm.grounding import (
    CopyBias,
    GroundingConfig,
    first_person,
    persona_statements,
    recalled,
    second_person,
)
from avatar.llm.persona import DEFAULT
from avatar.llm.sampling import Sampler, SamplingParams
from avatar.llm.template import Message, grounded
from evals.grounding import persona_set, states, user_facts


@pytest.fixture(scope="module")
def tokenizer():
    from avatar.llm.tokenizer import Tokenizer
    from serving.served import served_onnx

    return Tokenizer(Path(served_onnx("llm_decoder")).parent)


def test_sources_are_written_as_the_avatar_would_say_them():
    assert second_person("My name is Ada and my code is 4417. I'm a nurse, I am from Lisbon.") == (
        "Your name is Ada and your code is 4417. You're a nurse, you are from Lisbon."
    )
    assert first_person('You are Mia. When someone asks your name, answer "My name is Mia."') == (
        'I am Mia. When someone asks my name, answer "My name is Mia."'
    )


def test_the_bias_continues_the_span_the_reply_repeats(tokenizer):
    config = GroundingConfig(bonus=2.0)
    source = tokenizer.encode(" " + first_person(DEFAULT.system_prompt()))
    prompt = tokenizer.encode("<prompt>")
    reply = tokenizer.encode("Hello! My name is")
    mia, luna = tokenizer.encode(" Mia")[0], tokenizer.encode(" Luna")[0]
    scores = np.zeros(tokenizer.vocab_size, np.float64)
    scores[luna] = 1.0  # what the small model would say
    CopyBias([source], config, len(prompt)).apply(scores, prompt + reply)
    assert scores[mia] > scores[luna]
    # the greedy choice follows; without the bias it does not
    logits = np.zeros(tokenizer.vocab_size, np.float32)
    logits[luna], logits[mia] = 3.0, 1.0
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.0)
    assert Sampler(greedy).choose(logits, prompt + reply) == luna
    bias = CopyBias([source], config, len(prompt))
    assert Sampler(greedy, bias).choose(logits, prompt + reply) == mia


def test_no_bias_where_the_reply_repeats_nothing_or_only_the_prompt(tokenizer):
    config = GroundingConfig(bonus=2.0)
    source = tokenizer.encode(" My name is Mia.")
    prompt = tokenizer.encode("Tell me, my name is")  # the prompt's end is not the reply's
    scores = np.zeros(tokenizer.vocab_size, np.float64)
    CopyBias([source], config, len(prompt)).apply(scores, prompt + tokenizer.encode("Sure"))
    assert not scores.any()


class _Recorder(ReplyBackend):
    name = "recorder"

    def __init__(self) -> None:
        self.replies: list[Reply] = []

    def submit(self, reply: Reply) -> None:
        self.replies.append(reply)


def test_the_engine_gives_what_the_question_asks_about_and_the_passages():
    backend = _Recorder()
    config = EngineConfig(persona=DEFAULT.system_prompt(), grounding=GroundingConfig(bonus=1.0))
    engine = ChatEngine(backend, None, config)
    engine.sessions.save(
        "s",
        [
            Message("system", DEFAULT.system_prompt()),
            Message("user", "My code is 4417."),
            Message("assistant", "Noted."),
        ],
    )
    turn = json.dumps([{"role": "user", "content": "What is my code?"}])
    request = engine.parse(turn, "s", context="The spa opens at 9:30.")
    # a question about the user: their words (and the passages), not the persona's
    assert request.sources == ("Your code is 4417.", "The spa opens at 9:30.")
    name = engine.parse(json.dumps([{"role": "user", "content": "What is your name?"}]), "s")
    assert name.sources == (first_person(DEFAULT.system_prompt()),)
    engine.submit(request, lambda event: None)
    assert backend.replies[-1].sources == request.sources
    # off: nothing to copy
    plain = ChatEngine(_Recorder(), None, EngineConfig())
    assert plain.parse(turn, "s").sources == ()


def test_the_benchmark_sets_have_both_splits_and_judge_words():
    for split in ("dev", "test"):
        names = persona_set(split, "Mia")
        assert len(names.default) == len(names.own) >= 8
        assert len(user_facts(split)) >= 12
    assert states("You are allergic to peanuts.", ["peanut"])
    assert not states("Maybe later.", ["may"]) and not states("1200 euros", ["120"])


def test_a_question_about_someone_reads_what_is_known_about_them():
    config = GroundingConfig(recall=2, recall_persona=True)
    persona = "You are Mia, the receptionist. Answer in one to three short spoken sentences."
    assert persona_statements(persona) == "I am Mia, the receptionist."
    talk = [
        Message("system", persona),
        Message("user", "My code is 4417."),
        Message("assistant", "Noted."),
        Message("user", "I'm from Lisbon."),
        Message("assistant", "Lovely."),
    ]
    ask = [*talk, Message("user", "What is my code?")]
    assert recalled(ask, config) == "Your code is 4417. You're from Lisbon."
    # what they asked is not what they said of themselves
    asked = [*talk, Message("user", "Is breakfast included?"), Message("assistant", "Yes.")]
    assert recalled([*asked, ask[-1]], config) == "Your code is 4417. You're from Lisbon."
    assert recalled([*talk, Message("user", "What is your name?")], config) == (
        "I am Mia, the receptionist."
    )
    assert recalled([*talk, Message("user", "Where is the spa?")], config) == ""
    assert recalled(ask, GroundingConfig()) == ""


def test_the_engine_reads_the_users_words_beside_the_question_and_remembers_the_question():
    backend = _Recorder()
    engine = ChatEngine(backend, None, EngineConfig(grounding=GroundingConfig(recall=4)))
    engine.sessions.save("s", [Message("user", "My code is 4417."), Message("assistant", "OK.")])
    request = engine.parse(json.dumps([{"role": "user", "content": "What is my code?"}]), "s")
    assert request.messages[-1].content == grounded("What is my code?", "Your code is 4417.")
    assert request.remembered[-1] == Message("user", "What is my code?")


def test_the_grounding_parameter_is_checked():
    assert GroundingConfig.from_json('{"bonus": 1.5, "recall": 4}').recall == 4
    for bad in ('{"bonus": -1}', '{"boost": 1}', "[1]", '{"min_span": 0}'):
        with pytest.raises(ValueError, match="grounding"):
            GroundingConfig.from_json(bad)
