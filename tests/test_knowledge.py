"""Answers from the operator's documents (avatar/knowledge, docs/knowledge.md): splitting,
the index with the real all-MiniLM-L6-v2 graph the `emotion_encoder` model serves, the
token budget against SmolLM2's tokenizer, reload on change, the retrieval stage in a
turn's timings, and a venue question whose fact reaches the `llm` request."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from avatar.knowledge import (
    KnowledgeBase,
    KnowledgeConfig,
    KnowledgeError,
    Passage,
    Recall,
    check_knowledge_dir,
    estimate_tokens,
    load_passages,
    split_document,
)
from avatar.knowledge.base import choose
from avatar.knowledge.index import Hit, PassageIndex
from avatar.llm.template import parse_messages, with_persona
from avatar.pipeline import PipelineConfig, Speech, Stages, parse_turn, run_turn
from avatar.pipeline.prompt import KNOWLEDGE_SAMPLING, llm_messages, llm_sampling

VENUE = Path(__file__).resolve().parent.parent / "evals" / "knowledge" / "venue"
QUESTIONS = VENUE.parent / "questions.json"


# --------------------------------------------------------------------------- splitting
def test_markdown_sections_become_titled_passages():
    text = "# Spa\n\nIntro line.\n\n## Opening hours\n\nOpen 9:30 am\nto 8 pm.\n\n# Bar\nOpen late."
    passages = split_document(text, "spa.md")
    assert passages == [
        Passage("spa.md", "Spa", "Intro line."),
        Passage("spa.md", "Spa > Opening hours", "Open 9:30 am to 8 pm."),
        Passage("spa.md", "Bar", "Open late."),
    ]
    assert passages[1].full_text == "Spa > Opening hours: Open 9:30 am to 8 pm."


def test_paragraphs_merge_up_to_the_bound_and_long_ones_split():
    short = ["First fact.", "- a listed fact", "- another one", "Last fact."]
    (one,) = split_document("# T\n\n" + "\n\n".join(short), "t.md")
    assert one.text == "First fact. a listed fact another one Last fact."  # bullets dropped
    sentence = "The shuttle runs every forty minutes from the hotel entrance. "
    long = split_document("# T\n\n" + sentence * 20 + "x" * 130, "t.md", max_chars=120)
    assert len(long) > 5 and all(len(p.text) <= 120 for p in long)
    # nothing lost; a word longer than the bound is cut inside it
    assert "".join(p.text for p in long).replace(" ", "") == (sentence * 20 + "x" * 130).replace(
        " ", ""
    )


def test_plain_text_short_lines_alone_are_headings():
    text = "Getting around\n\nA shuttle runs every 40 minutes.\n\nNot a heading, a sentence.\n"
    passages = split_document(text, "a.txt", markdown=False)
    assert passages[0].title == "Getting around"
    assert passages[0].text.startswith("A shuttle runs") and passages[0].text.endswith("sentence.")
    (plain,) = split_document("# no markdown in .txt\nPool: 7 am", "b.txt", markdown=False)
    assert plain == Passage("b.txt", "", "# no markdown in .txt Pool: 7 am")
    assert split_document("Pool opens at 7", "c.txt", markdown=False)[0].text == "Pool opens at 7"


def test_the_venue_folder_splits_into_bounded_passages():
    passages = load_passages(VENUE)
    sources = {p.source for p in passages}
    assert sources == {"activities.txt", "hotel.md", "policies.md", "restaurant.md", "spa.md"}
    assert all(0 < len(p.text) <= KnowledgeConfig().max_chars for p in passages)
    assert any(p.title == "Tidewater Spa > Opening hours" for p in passages)
    path, count = check_knowledge_dir(VENUE)
    assert path.is_absolute() and count == len(passages)


def test_bad_folders_are_refused(tmp_path):
    with pytest.raises(KnowledgeError, match="not a directory"):
        check_knowledge_dir(tmp_path / "missing")
    with pytest.raises(KnowledgeError, match="no text"):
        check_knowledge_dir(tmp_path)
    (tmp_path / "bad.md").write_bytes(b"\xff\xfe\x00 not utf-8")
    with pytest.raises(KnowledgeError, match="UTF-8"):
        check_knowledge_dir(tmp_path)


# --------------------------------------------------------------------------- budget
@pytest.fixture(scope="module")
def smollm_tokenizer():
    from avatar.llm.tokenizer import Tokenizer
    from export.registry import ensure_all

    return Tokenizer(ensure_all(["llm_decoder"])["llm_decoder"])


def test_the_estimate_counts_more_tokens_than_smollm2(smollm_tokenizer):
    texts = [p.full_text for p in load_passages(VENUE)]
    texts += ["€45, 9:30am 12-14 room 2417", "seashell42 LarkspurGuest 0049-221-555-0199", "日本語"]
    for text in texts:
        assert estimate_tokens(text) >= len(smollm_tokenizer.encode(text)), text


def test_the_token_budget_holds(smollm_tokenizer):
    passages = load_passages(VENUE)
    hits = [Hit(p, 0.9 - i * 0.01) for i, p in enumerate(passages)]
    for budget in (20, 60, 120, 400):
        for count in (estimate_tokens, lambda t: len(smollm_tokenizer.encode(t))):
            config = KnowledgeConfig(passages=5, tokens=budget)
            found = choose(hits, config, count)
            assert found.tokens <= budget and len(found.hits) <= 5
            assert (
                len(smollm_tokenizer.encode(found.context)) <= budget
                or count is not estimate_tokens
            )
    # a passage too long for what is left is skipped; a shorter one after it still fits
    tiny = Passage("t.md", "", "Short.")
    found = choose([hits[0], Hit(tiny, 0.5)], KnowledgeConfig(passages=2, tokens=25), len)
    assert [h.passage for h in found.hits] == [tiny]
    weak = choose([Hit(tiny, 0.1)], KnowledgeConfig(min_score=0.2), len)
    assert weak == Recall() and weak.summary()["passages"] == 0


# --------------------------------------------------------------------------- the index
@pytest.fixture(scope="module")
def encoder():
    """The served emotion_encoder graph (its INT8 variant when gated), in this process."""
    import onnxruntime as ort

    from avatar.animation.emotion_classifier import SentenceTokenizer
    from serving.served import served_onnx

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(served_onnx("emotion_encoder")), options)
    tokenize = SentenceTokenizer()
    return lambda texts: session.run(["embedding"], tokenize(texts))[0]


@pytest.fixture(scope="module")
def venue(encoder) -> KnowledgeBase:
    base = KnowledgeBase(VENUE, encoder)
    assert base.refresh()
    return base


@pytest.mark.parametrize(
    ("question", "title"),
    [
        ("Where is the spa?", "Tidewater Spa > Where it is"),
        ("What's the wifi password?", "Larkspur Bay Hotel > Wi-Fi"),
        ("Who cooks at the restaurant?", "The Saltmarsh restaurant"),
        ("Can I smoke on my balcony?", "Policies > Smoking"),
        ("How much is it to rent a kayak?", "Things to do"),
    ],
)
def test_the_index_finds_the_passage(venue, question, title):
    assert venue.search(question, 1)[0].passage.title == title


def test_retrieval_over_the_benchmark_questions(venue):
    questions = json.loads(QUESTIONS.read_text())
    first = sum(
        any(
            e.lower() in venue.search(q["question"], 1)[0].passage.full_text.lower()
            for e in q["expect"]
        )
        for q in questions
    )
    assert first >= 0.9 * len(questions)  # 24/26 measured (docs/knowledge.md)


def test_small_talk_gets_no_passages(venue):
    for text in ("Hello, how are you?", "What's your name?", "Tell me a joke."):
        assert venue.recall(text) == Recall(), text


def test_search_is_exact_cosine():
    passages = [Passage("a", "", str(i)) for i in range(4)]
    index = PassageIndex(passages, np.eye(4, dtype=np.float32) * 3)
    hits = index.search(np.array([0.1, 0.0, 2.0, 1.0]), 2)
    assert [h.passage.text for h in hits] == ["2", "3"]
    assert hits[0].score == pytest.approx(2.0 / np.linalg.norm([0.1, 0, 2, 1]))
    with pytest.raises(ValueError, match="numbers"):
        index.search(np.zeros(3), 1)


# --------------------------------------------------------------------------- reload
def hashed(texts) -> np.ndarray:
    """A stand-in encoder: bag of hashed words (same words, same direction)."""
    out = np.zeros((len(texts), 64), np.float32)
    for row, text in enumerate(texts):
        for word in re.findall(r"\w+", text.lower()):
            out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1
    return out


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_documents_reload_when_they_change(tmp_path):
    doc = tmp_path / "faq.md"
    doc.write_text("# Pool\n\nThe pool opens at 7 am.\n\n# Gym\n\nThe gym opens at 6 am.\n")
    calls: list[int] = []
    clock = Clock()

    def encoder(texts):
        calls.append(len(texts))
        return hashed(texts)

    base = KnowledgeBase(tmp_path, encoder, KnowledgeConfig(check_s=5.0), clock=clock)
    assert base.loads == 0 and calls == []  # embedding waits for the first use
    assert "7 am" in base.recall("When does the pool open?").context
    assert base.loads == 1 and calls == [2, 1]  # two passages, then the question
    doc.write_text("# Pool\n\nThe pool opens at 8 am.\n\n# Gym\n\nThe gym opens at 6 am.\n")
    os.utime(doc, ns=(1, doc.stat().st_mtime_ns + 10**9))
    clock.now = 1.0  # within check_s: not looked at
    assert "7 am" in base.recall("When does the pool open?").context
    clock.now = 6.0
    assert "8 am" in base.recall("When does the pool open?").context
    assert base.loads == 2 and calls[3] == 1  # only the changed passage was embedded again
    clock.now = 12.0
    (tmp_path / "new.txt").write_text("Spa\n\nThe spa opens at 9 am.\n")
    assert "9 am" in base.recall("When does the spa open?").context
    clock.now = 18.0
    assert not base.refresh()  # nothing changed: no reload


def test_a_failed_reload_keeps_the_previous_documents(tmp_path):
    doc = tmp_path / "faq.md"
    doc.write_text("# Pool\n\nThe pool opens at 7 am.\n")
    broken = [False]

    def encoder(texts):
        if broken[0]:
            raise RuntimeError("encoder down")
        return hashed(texts)

    base = KnowledgeBase(tmp_path, encoder, KnowledgeConfig(check_s=0.0))
    assert base.refresh()
    doc.write_text("# Pool\n\nThe pool opens at 8 am, now.\n")
    broken[0] = True
    assert not base.refresh()
    assert base.index.passages[0].text == "The pool opens at 7 am."
    broken[0] = False
    assert base.refresh() and "8 am" in base.index.passages[0].text  # retried


# --------------------------------------------------------------------------- the turn
def silent(text, request):
    yield Speech(np.zeros(1600, np.float32), 16000, [], np.zeros(0), np.zeros(0), text)


def turn_with(recall, text="Where is the spa?"):
    seen: list = []

    def chat(words, request, stop):
        seen.append((llm_messages(words, request), llm_sampling(request, 96), request.context))
        yield "It is downstairs."

    stages = Stages(lambda audio: "", chat, silent, recall=recall)
    final = run_turn(parse_turn(None, text), stages, lambda e: None, lambda: "", PipelineConfig())
    return final, seen


def test_retrieval_is_a_stage_of_the_turn():
    passage = Passage("spa.md", "Spa", "The spa is on the lower ground floor.")
    found = Recall(
        (Hit(passage, 0.7),), "Information: Spa: The spa is on the lower ground floor.", 14
    )
    final, seen = turn_with(lambda text: found)
    assert "knowledge" in final.timings["stage_ms"]
    assert final.timings["knowledge"] == {"passages": 1, "tokens": 14, "best_score": 0.7}
    ((messages, sampling, context),) = seen
    # the passages travel apart (the llm's `context` input), the user's words as said
    assert messages == [{"role": "user", "content": "Where is the spa?"}]
    assert context == "Information: Spa: The spa is on the lower ground floor."
    assert sampling == {"seed": 0, "max_tokens": 96, **KNOWLEDGE_SAMPLING}


def test_a_failed_lookup_answers_without_documents():
    def broken(text):
        raise RuntimeError("emotion_encoder: not ready")

    final, seen = turn_with(broken)
    assert final.reply == "It is downstairs."
    assert final.errors == ["knowledge: emotion_encoder: not ready"]
    assert seen[0][0] == [{"role": "user", "content": "Where is the spa?"}]
    assert "temperature" not in seen[0][1]  # the llm's own sampling
    assert "knowledge" in final.timings["stage_ms"]


def test_a_client_cannot_send_context():
    with pytest.raises(Exception, match="unknown controls"):
        parse_turn(None, "hi", controls=json.dumps({"context": "Information: free rooms"}))
    assert parse_turn(None, "hi").context == ""


def test_a_venue_question_gets_its_fact_into_the_llm_request(venue):
    final, seen = turn_with(venue.recall, "What is the wifi password?")
    ((messages, _sampling, context),) = seen
    assert "seashell42" in context and messages[-1]["content"] == "What is the wifi password?"
    assert final.timings["knowledge"]["passages"] == 1
    # the llm engine keeps its own persona (no system message was sent)
    parsed = with_persona(parse_messages(messages), "You are Mia.")
    assert parsed[0].content == "You are Mia."
    # a persona the trusted caller set stays the system message; the passage stays with it
    controls = dataclasses.replace(parse_turn(None, "x").controls, persona="You are Ada.")
    request = dataclasses.replace(
        parse_turn(None, "x"), controls=controls, context="Information: y"
    )
    assert llm_messages("Hi?", request)[0] == {"role": "system", "content": "You are Ada."}
