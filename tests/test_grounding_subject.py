"""Whom a question asks about (avatar/llm/subject.py): the words of the question, backed by
the served MiniLM (`emotion_encoder`) for questions that speak to "you" without saying
what about. Judged by the real model on questions written for this test (none of them a
prototype); `python -m perf says --variants served +subject` measures what it changes."""

from __future__ import annotations

import json

import pytest

from avatar.llm.backend import Reply, ReplyBackend
from avatar.llm.engine import ChatEngine, EngineConfig
from avatar.llm.grounding import GroundingConfig, asks_about, persona_statements
from avatar.llm.persona import DEFAULT
from avatar.llm.subject import PROTOTYPES, SubjectJudge, elliptic, question_sentences
from avatar.llm.template import grounded

SERVED = {"bonus": 1.5, "recall": 4, "recall_persona": True}


class _Recorder(ReplyBackend):
    name = "recorder"

    def submit(self, reply: Reply) -> None:
        pass


@pytest.fixture(scope="module")
def embed():
    from perf.says import _embedding_model

    return _embedding_model()


def test_questions_the_words_miss_are_judged_by_the_embedding(embed):
    judge = SubjectJudge(embed)
    avatar = [
        "How do people refer to you?",
        "Are you the concierge?",
        "Would you tell me who I'm speaking with?",
        "And you?",  # no word of its own: it asks the avatar
    ]
    venue = ["How late are you open?", "Do you serve vegan food?", "Do you accept credit cards?"]
    written = {text for texts in PROTOTYPES.values() for text in texts}
    assert not (set(avatar) | set(venue)) & written
    for question in avatar:
        assert not asks_about(question).avatar, question  # the words alone miss it
        assert asks_about(question, judge.asks_the_avatar).avatar, question
    for question in [*venue, "Where is the spa?", "What is my code?"]:
        assert not asks_about(question, judge.asks_the_avatar).avatar, question
    # whose: the pronouns, not the embedding (MiniLM puts "my name" beside "your name")
    assert asks_about("What is my name?", judge.asks_the_avatar).user
    assert not asks_about("What is my name?", judge.asks_the_avatar).avatar


def test_the_question_is_its_asking_sentences_and_an_elliptic_one_asks_the_avatar():
    assert question_sentences("Nice to meet you, I'm Lena. And you?") == ["And you?"]
    assert question_sentences("Tell me about the spa.") == ["Tell me about the spa."]
    assert elliptic("And you?") and elliptic("What's yours?")
    assert not elliptic("How late are you open?") and not elliptic("And the pool?")


def test_the_engine_reads_the_persona_beside_what_the_judge_recognises(embed):
    persona = DEFAULT.system_prompt()
    question = "How do people refer to you?"
    turn = json.dumps([{"role": "user", "content": question}])
    judged = GroundingConfig(**SERVED, subject="embedding")
    engine = ChatEngine(_Recorder(), None, EngineConfig(grounding=judged, embed=embed))
    request = engine.parse(turn, "")
    assert request.messages[-1].content == grounded(question, persona_statements(persona))
    assert request.remembered[-1].content == question
    words = ChatEngine(_Recorder(), None, EngineConfig(grounding=GroundingConfig(**SERVED)))
    assert words.parse(turn, "").messages[-1].content == question
    venue = json.dumps([{"role": "user", "content": "How late are you open?"}])
    assert engine.parse(venue, "").messages[-1].content == "How late are you open?"


def test_the_subject_setting_is_checked_and_needs_the_model():
    assert GroundingConfig.from_json('{"subject": "embedding"}').embeds
    assert not GroundingConfig.from_json('{"subject": "words"}').embeds
    with pytest.raises(ValueError, match="subject"):
        GroundingConfig.from_json('{"subject": "vibes"}')
    with pytest.raises(ValueError, match="embed"):
        ChatEngine(_Recorder(), None, EngineConfig(grounding=GroundingConfig(subject="embedding")))


def test_a_failing_embedding_model_leaves_the_words_to_decide():
    def unavailable(texts):  # what a BLS call to an unloaded model raises, as it reaches us
        raise RuntimeError("emotion_encoder is not ready")

    judge = SubjectJudge(unavailable)
    assert not judge.asks_the_avatar("How do people refer to you?")
    assert asks_about("What is your name?", judge.asks_the_avatar).avatar  # the words still do
