"""Replies a person listens to (issue 34, item 4): the sentence budget enforced by the
server (the LLM stream and the avatar turn), stage directions, emoji and markup kept from
the TTS, and numbers, times, prices and phone numbers read naturally."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from avatar.llm.stream import SentenceSplitter, TextStream
from avatar.pipeline import PipelineConfig, SentenceEvent, Speech, Stages, parse_turn, run_turn
from avatar.sentences import ends_sentence, split_sentences, spoken_text
from avatar.tts.normalize import clean, normalize

log = logging.getLogger(__name__)


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("(laughs) Sure, I can help!", "Sure, I can help!"),
        (
            "*smiles warmly* The spa is on the **second** floor. 😊",
            "The spa is on the second floor.",
        ),
        ("[pause] Okay, let me check.", "Okay, let me check."),
        ("Hello (waves) !", "Hello!"),
        ("(with a grin) Of course!", "Of course!"),
        ("Sure! (excitedly) Let's go.", "Sure! Let's go."),
        ("It is *really* nice :)", "It is really nice"),
        ("## Opening hours", "Opening hours"),
        ("- Pool: open daily", "Pool: open daily"),
        ("2. The gym", "The gym"),
        ("See <b>this</b> &amp; that<br/>", "See this & that"),
        ("Visit https://www.grandhotel.com/spa?x=1.", "Visit grandhotel.com."),
        ("Read [the guide](https://example.com/a).", "Read the guide."),
        ("Use `wifi-guest` to log in.", "Use wifi-guest to log in."),
        ("The walk (about 5 minutes) is nice.", "The walk (about 5 minutes) is nice."),
        ("I love it <3 🎉", "I love it"),
        ("🍎💡", ""),
        ("*laughs*", ""),
    ],
)
def test_stage_directions_emoji_and_markup_are_not_spoken(text: str, spoken: str) -> None:
    assert spoken_text(text) == spoken


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("It costs $12.50.", "It costs twelve dollars fifty."),
        ("Just $0.75 or $3.", "Just seventy-five cents or three dollars."),
        ("See you at 7:30 pm!", "See you at seven thirty PM!"),
        ("Breakfast from 7 a.m. to 10:30 a.m.", "Breakfast from seven AM to ten thirty AM"),
        ("The 2nd floor.", "The second floor."),
        ("We have 1,200 rooms.", "We have one thousand two hundred rooms."),
        ("Built in 1984.", "Built in nineteen eighty-four."),
        ("Up 15% today.", "Up fifteen percent today."),
        ("Call 555-123-4567 now.", "Call five five five, one two three, four five six seven now."),
        ("Call (555) 123-4567.", "Call five five five, one two three, four five six seven."),
        ("Dial 5551234567.", "Dial five five five one two three four five six seven."),
        ("On 2024-03-05.", "On March fifth, twenty twenty-four."),
        ("Pages 10-20.", "Pages ten-twenty."),
        ("(laughs) It's $5!", "It's five dollars!"),
    ],
)
def test_numbers_times_and_prices_read_naturally(text: str, spoken: str) -> None:
    assert normalize(clean(text).text) == spoken


REPLY = (
    "Hi! I'm Mia. (smiles) The spa is on the second floor. It opens at nine. "
    "You can book at the front desk. Anything else?"
)


def _stream(max_sentences: int) -> tuple[TextStream, str, int]:
    """REPLY streamed two characters per id through TextStream + SentenceSplitter."""
    pieces = [REPLY[i : i + 2] for i in range(0, len(REPLY), 2)]
    stream = TextStream(lambda i: pieces[i], stop=("<|im_end|>",), max_sentences=max_sentences)
    splitter = SentenceSplitter()
    shown, sentences, used = "", [], 0
    for used, _ in enumerate(pieces, 1):
        delta = stream.push(used - 1)
        shown += delta
        sentences += [c.sentence for c in splitter.push(delta) if c.sentence]
        if stream.stopped:
            break
    shown += stream.finish()
    if last := splitter.flush():
        sentences.append(last)
    assert "".join(sentences).replace(" ", "") == shown.replace(" ", "")
    return stream, shown, used


def test_the_stream_stops_after_the_sentence_budget() -> None:
    stream, shown, used = _stream(3)
    # "(smiles)" is not a sentence with something to say: it does not spend the budget
    assert shown == "Hi! I'm Mia. (smiles) The spa is on the second floor."
    assert stream.stopped and stream.sentences == 3 and used < len(REPLY) // 2
    whole = _stream(0)[1]
    assert whole == REPLY and split_sentences(whole)[-1] == "Anything else?"


def test_a_first_clause_is_not_a_sentence_of_the_budget() -> None:
    assert not ends_sentence("Well, the museum opens at nine, ")
    assert not ends_sentence("Breakfast is served - ")
    assert ends_sentence("It opens at nine.") and ends_sentence("and that is all")


@pytest.fixture(scope="module")
def smollm():
    pytest.importorskip("torch")
    from avatar.llm.decoder import OrtDecoder
    from avatar.llm.tokenizer import Tokenizer
    from export.common import ensure
    from export.llm.recipe import LlmDecoderRecipe

    artifact = ensure(LlmDecoderRecipe())
    return OrtDecoder(artifact / "model.onnx"), Tokenizer(artifact)


def test_a_real_generation_ends_at_the_budget(smollm) -> None:
    """The packaged SmolLM2 asked for a long story: the generation itself ends after two
    sentences ("stop", far below max_tokens), and what it streamed is those two."""
    from avatar.llm.cache import PrefixCache
    from avatar.llm.sampling import Sampler, SamplingParams
    from avatar.llm.scheduler import Event, Generation, Scheduler
    from avatar.llm.sequences import KvCacheSequences
    from avatar.llm.template import Message

    decoder, tokenizer = smollm
    messages = [Message("user", "Tell me a long story about a dragon and a knight.")]
    prompt = tokenizer.encode_segments(tokenizer.template.render_segments(messages))
    params = SamplingParams(temperature=0, max_tokens=200)
    events: list[Event] = []
    generation = Generation(
        prompt=prompt,
        sampler=Sampler(params),
        stream=TextStream(tokenizer.stream_decoder(), params.stop, max_sentences=2),
        emit=events.append,
    )
    scheduler = Scheduler(KvCacheSequences(decoder, PrefixCache(2)), tokenizer.stop_ids)
    scheduler.submit(generation)
    scheduler.run_until_idle()
    final = events[-1]
    text = "".join(c.text for e in events for c in e.chunks)
    sentences = [c.sentence for e in events for c in e.chunks if c.sentence]
    log.info("budgeted reply (%d tokens): %r", len(generation.generated), text)
    assert final.finish_reason == "stop", final
    assert len(sentences) == 2 and len(split_sentences(text)) == 2, sentences
    assert len(generation.generated) < params.max_tokens


RATE = 22050


class ChattyStages:
    """An LLM that writes seven pieces (stage directions, emoji, markdown among them) and
    counts how many it was let write; a TTS that records what it was given."""

    PIECES = (
        "*smiles* Welcome to the **Grand Hotel**! ",
        "(laughs) ",
        "😊 ",
        "Breakfast is $12.50, served at 7:30 am. ",
        "- The spa is on the 2nd floor. ",
        "Call 555-123-4567 to book. ",
        "Anything else? ",
    )

    def __init__(self) -> None:
        self.written = 0
        self.spoken: list[str] = []
        self.cuts: list[str] = []

    def chat(self, text, request, stop):
        for piece in self.PIECES:
            if stop() or self.cuts:  # a cut ends the generation, as the llm model's stop does
                return {"finish_reason": "cancelled"}
            self.written += 1
            yield piece
        return {}

    def speak(self, text: str, request) -> object:
        self.spoken.append(text)
        n = 2205
        yield Speech(np.zeros(n, np.float32), RATE, ["a"], np.zeros(1), np.full(1, 0.1), text)

    def stages(self) -> Stages:
        return Stages(
            lambda audio: "",
            self.chat,
            self.speak,
            cut=lambda request, spoken: self.cuts.append(spoken),
        )


def test_the_turn_speaks_three_clean_sentences_and_cuts_the_generation() -> None:
    fake = ChattyStages()
    events: list = []
    final = run_turn(parse_turn(None, "hi", "s1", ""), fake.stages(), events.append, lambda: "")
    said = [e.text for e in events if isinstance(e, SentenceEvent)]
    expected = [
        "Welcome to the Grand Hotel!",
        "Breakfast is $12.50, served at 7:30 am.",
        "The spa is on the 2nd floor.",
    ]
    assert said == expected and fake.spoken == expected  # captions and TTS alike
    # the generation was stopped at the budget, and the session keeps what was spoken
    assert fake.cuts == [" ".join(expected)]
    assert fake.written <= len(expected) + 3 < len(ChattyStages.PIECES) + 1
    assert final.reply == " ".join(expected) and not final.errors


def test_the_budget_is_a_config_field() -> None:
    fake = ChattyStages()
    config = dataclasses.replace(PipelineConfig(), max_sentences=1)
    events: list = []
    run_turn(parse_turn(None, "hi", "s1", ""), fake.stages(), events.append, lambda: "", config)
    assert [e.text for e in events if isinstance(e, SentenceEvent)] == [
        "Welcome to the Grand Hotel!"
    ]
    assert PipelineConfig().max_sentences == 3
