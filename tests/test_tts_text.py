"""avatar/tts text side: checks, normalisation, sentences, phonemes and Piper's ids (no model)."""

from __future__ import annotations

import numpy as np
import pytest
from piper_phonemize import phoneme_ids_espeak, phonemize_espeak

from avatar.errors import RequestError
from avatar.sentences import split_sentences
from avatar.tts import numbers
from avatar.tts.normalize import clean, normalize
from avatar.tts.phonemes import Chunk, Phonemizer, prepare
from avatar.tts.request import parse_request
from avatar.tts.sentences import split_long
from avatar.tts.synth import Controls, phoneme_timings
from avatar.tts.voice import packaged_voice


@pytest.fixture(scope="module")
def config():
    return packaged_voice().config


@pytest.fixture(scope="module")
def phonemizer(config):
    return Phonemizer(config)


def test_voice_config(config):
    assert config.sample_rate == 22050
    assert config.espeak_voice == "en-us"
    assert (config.noise_scale, config.length_scale, config.noise_w) == (0.667, 1.0, 0.8)
    assert config.phoneme_id_map["^"] == (1,) and config.phoneme_id_map["_"] == (0,)


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (13, "thirteen"),
        (21, "twenty-one"),
        (105, "one hundred five"),
        (1_000_001, "one million one"),
        (-7, "minus seven"),
    ],
)
def test_cardinal(n, words):
    assert numbers.cardinal(n) == words


def test_ordinal_and_year():
    assert [numbers.ordinal(n) for n in (1, 2, 3, 12, 21, 40)] == [
        "first", "second", "third", "twelfth", "twenty-first", "fortieth"
    ]  # fmt: skip
    assert numbers.year(1984) == "nineteen eighty-four"
    assert numbers.year(2005) == "two thousand five"
    assert numbers.year(1900) == "nineteen hundred"
    assert numbers.year(1907) == "nineteen oh seven"


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("Dr. Smith arrived at 10:30 a.m.", "Doctor Smith arrived at ten thirty AM"),
        ("It costs $5.50.", "It costs five dollars fifty."),
        ("Meet me on 2024-03-05!", "Meet me on March fifth, twenty twenty-four!"),
        ("Born 12/25/1990, at 7pm.", "Born December twenty-fifth, nineteen ninety, at seven PM."),
        ("About 12.5% of 1,250 people", "About twelve point five percent of one thousand two "
         "hundred fifty people"),
        ("The 21st of March 3rd.", "The twenty-first of March third."),
        ("St. Paul lives on Main St. now", "Saint Paul lives on Main Street now"),
        ("Call 007, e.g. now", "Call zero zero seven, for example now"),
        ("I said no. Yes?", "I said no. Yes?"),
    ],
)  # fmt: skip
def test_normalize(text, spoken):
    assert normalize(clean(text).text) == spoken


def test_clean_drops_what_cannot_be_spoken():
    result = clean("Hi 😀 there\x07, 你好 café\u200b!")
    assert result.text.split() == ["Hi", "there", ",", "café", "!"]
    assert set(result.dropped) == {"😀", "\x07", "你", "好", "\u200b"}
    assert clean("“Quoted” — dash").text.split() == ['"Quoted"', ",", "dash"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("", "text is empty"),
        (" \n\t ", "text is empty"),
        ("?!... ---", "only punctuation"),
        ("😀🎉", "no speakable characters"),
        (b"caf\xc3", "not valid UTF-8"),
        (b"\xff\xfehello", "not valid UTF-8"),
        ("a" * 50_000, "at most 20000"),
    ],
)
def test_bad_text_is_a_request_error(data, message, phonemizer):
    with pytest.raises(RequestError, match=message):
        prepare(data, phonemizer)


def test_utf8_bytes_are_accepted(phonemizer):
    assert prepare("café".encode(), phonemizer).chunks[0].text == "café"


def test_split_sentences():
    text = 'He asked: "Why?" She left. Then... nothing!\nNew line'
    assert split_sentences(text) == ['He asked: "Why?"', "She left.", "Then...", "nothing!",
                                     "New line"]  # fmt: skip


@pytest.mark.parametrize(
    "sentence",
    [
        "Hello world, how are you today?",
        "The quick brown fox jumps over the lazy dog.",
        "Wait; what (exactly) did she say: yes, or no!",
    ],
)
def test_ids_match_piper(phonemizer, sentence):
    """Ids as piper-phonemize computes them for training: ^ _ p0 _ p1 _ ... $."""
    (chunk,) = prepare(sentence, phonemizer).chunks
    (reference,) = phonemize_espeak(sentence, "en-us")
    assert list(chunk.phonemes) == reference
    assert list(chunk.ids) == phoneme_ids_espeak(reference)
    assert len(chunk.symbols) == len(chunk.ids)


def test_long_sentence_is_split_never_cut(config):
    phonemizer = Phonemizer(config, max_phonemes=40)
    sentence = (
        "This rather long sentence, which has several clauses; keeps going on and on "
        "without a full stop until it finally ends with a handful of extra words."
    )
    chunks = prepare(sentence, phonemizer).chunks
    assert len(chunks) > 2
    assert all(len(c.phonemes) <= 40 for c in chunks)
    assert " ".join(c.text for c in chunks).split() == sentence.split()


def test_one_huge_word_is_split(config):
    phonemizer = Phonemizer(config, max_phonemes=30)
    word = "supercalifragilisticexpialidocious" * 3
    chunks = prepare(word, phonemizer).chunks
    whole = phonemizer.known(phonemizer.phonemize(word))
    assert [p for c in chunks for p in c.phonemes] == whole
    assert all(len(c.phonemes) <= 30 for c in chunks)


def test_long_text_keeps_every_sentence(phonemizer):
    text = " ".join(f"Sentence number {n} is here." for n in range(1, 61))
    chunks = prepare(text, phonemizer).chunks
    assert len(chunks) == 60
    assert chunks[-1].text == "Sentence number sixty is here."


def test_split_long_keeps_words():
    pieces = split_long("a b c d e f g", cost=len, limit=5)
    assert pieces == ["a b c", "d e f", "g"]


@pytest.mark.parametrize(
    ("controls", "message"),
    [
        ({"length_scale": 0.0}, "length_scale"),
        ({"length_scale": 9.0}, "length_scale"),
        ({"noise_scale": -0.1}, "noise_scale"),
        ({"noise_w": float("nan")}, "noise_w"),
        ({"seed": -1}, "seed"),
    ],
)
def test_controls_out_of_range(config, controls, message):
    with pytest.raises(RequestError, match=message):
        Controls.defaults(config, **controls)


def test_parse_request(config):
    text, controls = parse_request(
        {"text": np.array([b"Hi"], dtype=object), "length_scale": np.array([1.5], np.float32),
         "seed": np.array([7], np.int64)},
        config,
    )  # fmt: skip
    assert text == b"Hi"
    assert (controls.length_scale, controls.noise_scale, controls.seed) == (1.5, 0.667, 7)
    with pytest.raises(RequestError, match="missing input 'text'"):
        parse_request({}, config)
    with pytest.raises(RequestError, match="2 strings"):
        parse_request({"text": np.array([b"a", b"b"], dtype=object)}, config)
    with pytest.raises(RequestError, match="seed"):
        parse_request({"text": np.array([b"a"], dtype=object), "seed": np.array([1.5])}, config)


def test_phoneme_timings_cover_every_frame():
    chunk = Chunk("hi", ("h", "a", "ɪ"), (1, 0, 20, 0, 14, 0, 74, 0, 2))
    durations = np.array([3, 1, 2, 0, 4, 1, 5, 2, 6, 0, 0])  # padded beyond the ids
    names, starts, ends = phoneme_timings(chunk, durations, 256 / 22050)
    assert names == ("^", "h", "a", "ɪ", "$")
    frames = np.round(np.array(ends) / (256 / 22050)).astype(int)
    assert frames.tolist() == [4, 6, 11, 18, 24]
    assert starts[0] == 0 and np.allclose(starts[1:], ends[:-1])


def test_one_splitter_for_tts_and_the_llm_stream():
    """The TTS and the LLM stream cut the same text at the same places (one rule, one
    abbreviation list): not after "Dr.", an initial, or inside "3.5"."""
    from avatar.llm.stream import SentenceSplitter

    text = "I am Dr. Smith. J. Smith paid 3.5 dollars! Did he?\nYes e.g. now. "
    splitter = SentenceSplitter()
    streamed = [c.sentence for piece in text.split(" ") for c in splitter.push(piece + " ")]
    streamed = [s for s in streamed if s] + [s for s in [splitter.flush()] if s]
    assert split_sentences(text) == streamed == [
        "I am Dr. Smith.", "J. Smith paid 3.5 dollars!", "Did he?", "Yes e.g. now."
    ]  # fmt: skip
