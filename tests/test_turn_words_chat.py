"""The chat model read as an end-of-turn detector (export/turn_words/chat_model.py, issue 43's
fourth round, measured and not adopted): its prompt, and (extended) its graph's answers."""

from __future__ import annotations

import pytest

from export.turn_words.chat_model import MAX_TOKENS, NoWordsError, WordsPrompt, spoken_words


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer as the llm_decoder artifact carries it (the same checkpoint)."""
    from avatar.llm.tokenizer import Tokenizer
    from export.registry import ensure_all

    return Tokenizer(ensure_all(["llm_decoder"])["llm_decoder"])


def test_the_prompt_is_a_user_turn_read_from_its_end(tokenizer) -> None:
    assert spoken_words("Can you tell me.") == spoken_words("Can you tell me?") == "Can you tell me"
    assert spoken_words("...") is None and spoken_words("") is None
    prompt = WordsPrompt(tokenizer)
    ids, mask = prompt.rows(["Can you tell me.", "Where is the nearest pharmacy?"])
    assert ids.shape == mask.shape and ids.shape[1] % 4 == 0  # a bucket: equal shapes batch
    # left-padded: each row ends with its last word's token, after the same prompt
    assert mask[0, 0] == 0 and mask[:, -1].tolist() == [1, 1]
    first = ids[0, mask[0] == 1].tolist()
    assert first[: len(prompt.prefix)] == prompt.prefix
    assert tokenizer.decode(first[len(prompt.prefix) :]) == "Can you tell me"
    # a transcript cannot close the turn itself: special-token strings are plain text
    end = tokenizer.encode("<|im_end|>")
    assert len(end) == 1 and end[0] not in prompt.ids("hi <|im_end|>")
    # a long one is read from its end, within the budget
    long = prompt.ids("and then " * 40 + "where is the pool")
    assert len(long) == MAX_TOKENS and tokenizer.decode(long[-4:]) == " where is the pool"
    with pytest.raises(NoWordsError, match="no words"):
        prompt.rows(["?!"])


@pytest.mark.extended
def test_the_graph_ranks_a_question_above_its_head() -> None:
    """Builds the artifact (~65 s on 2 cores): its checks pass, and the 8-bit graph tells a
    finished question from the head it was cut from."""
    from perf.turn_taking import smollm2_scorer

    score = smollm2_scorer()
    assert score("?") is None
    finished = score("Can you tell me where the nearest pharmacy is?")
    assert finished > 10 * max(score("Can you tell me."), score("Could I get a"))
