"""The end-of-turn evaluation (evals/turn_taking.py, perf/turn_taking.py): its material
(the dev/test split, the pauses where the heads end) and small runs of the harness with the
real VAD, Smart Turn, Whisper and voices."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from evals import turn_taking as tt


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def test_dev_and_test_share_no_question() -> None:
    dev, test = tt.questions("dev"), tt.questions("test")
    assert len(dev) == len(test) == 20
    assert {q.kind for q in dev} == {q.kind for q in test} == set(tt.KINDS)
    for part in ("head", "rest", "text"):  # no phrase of a test question is seen on dev
        seen = {tuple(_words(getattr(q, part))) for q in dev}
        assert not seen & {tuple(_words(getattr(q, part))) for q in test}, part
    statements = {s: [t for t, split in tt.complete_turns() if split == s] for s in tt.SPLITS}
    assert len(statements["dev"]) == len(statements["test"]) == 10
    assert not set(statements["dev"]) & set(statements["test"])
    clips = [split for _, _, split in tt._recordings()]
    assert set(clips) == {"dev", "test"}


def test_each_pause_sits_where_its_head_ends() -> None:
    """Every unfinished item (one question per voice and split, every pause): P seconds of
    digital silence start at `head_end`, speech comes before it and after it."""
    unfinished = [i for i in tt.items(limit=1) if not i.finished]
    assert {i.family for i in unfinished} == set(tt.FAMILIES)
    assert len(unfinished) == (len(tt.VOICES) * 2 + 2) * len(tt.PAUSES)
    for item in unfinished:
        gap = round(item.pause_s * tt.SAMPLE_RATE)
        assert not np.any(item.audio[item.head_end : item.head_end + gap]), item
        before = item.audio[item.head_end - tt.SAMPLE_RATE // 5 : item.head_end]
        after = item.audio[item.head_end + gap : item.head_end + gap + tt.SAMPLE_RATE // 2]
        assert np.abs(before).max() > 0.01 and np.abs(after).max() > 0.05, item
        assert item.head_end < item.end < len(item.audio) - round(tt.TAIL_S * tt.SAMPLE_RATE) + 1


@pytest.mark.parametrize("index", [0, 10, 25])  # a verb, an opener, a subordinate clause
def test_the_piper_head_ends_at_its_last_word(index: int) -> None:
    """Whisper hears the head alone up to its last word, and the rest from its first; its
    end mark after the head is unlikely, after the whole question likely."""
    from perf.endpointing import _transcriber

    question = tt.questions()[index]
    voice = tt.VOICES[0]
    audio, at = tt.hesitating(voice, question.head, question.rest, 0.5)
    transcribe = _transcriber()
    silence = np.zeros(8000, np.float32)
    (head_text, head_end), (whole_text, whole_end) = (
        transcribe(np.concatenate([audio[:at], silence])),
        transcribe(np.concatenate([audio, silence])),
    )
    head, rest = _words(head_text), _words(transcribe(audio[at:])[0])
    assert head[-1:] == _words(question.head)[-1:], (question, head)
    assert rest[:1] == _words(question.rest)[:1], (question, rest)
    # Whisper hears the head as unfinished whatever mark it wrote, the question as finished
    # (its end mark after the last word: avatar.asr.greedy.WindowResult.end_probability)
    assert head_end is not None and whole_end is not None, (head_text, whole_text)
    assert head_end < 0.5 < whole_end, (head_text, head_end, whole_text, whole_end)


def test_silence_cuts_a_long_pause_and_not_a_short_one() -> None:
    """`silence 0.7` ends the turn in a 1.2-s pause (cut) and waits through a 0.3-s one."""
    from perf.turn_taking import default_strategies, run

    question = tt.questions("dev")[0]
    material = [tt.unfinished(tt.VOICES[0], question, pause) for pause in (1.2, 0.3)]
    silence = [s for s in default_strategies() if s[0] == "silence 0.7"]
    (row,) = run(silence, material, pauses=(0.3, 1.2))
    assert (row["strategy"], row["split"], row["heads"]) == ("silence 0.7", "dev", 2)
    assert row["cut_1.2"] == 1.0 and row["cut_0.3"] == 0.0
    assert row["cut_piper_1.2"] == 1.0 and row["cut_espeak_1.2"] is None


def test_choose_takes_the_fastest_strategy_that_cuts_at_most_a_tenth() -> None:
    from perf.turn_taking import choose

    def row(name: str, split: str, cuts: tuple[float, float], p50: int) -> dict:
        return {"strategy": name, "split": split, "cut_0.3": cuts[0], "cut_1.2": cuts[1],
                "delay_p50_ms": p50}  # fmt: skip

    rows = [
        row("slow", "dev", (0.0, 0.1), 900),
        row("fast", "dev", (0.0, 0.2), 300),  # cuts too many at 1.2 s
        row("middle", "dev", (0.05, 0.0), 500),
        row("best on test", "test", (0.0, 0.0), 100),  # test rows never choose
    ]
    assert choose(rows, (0.3, 1.2)) == "middle"
    # none cuts none: the fewest cut among those no slower than the baseline ("slow")
    assert choose(rows, (0.3, 1.2), max_cut=0.0, baseline="slow") == "middle"
    assert choose(rows, (0.3, 1.2), max_cut=0.0, baseline="fast") == "fast"
    assert choose(rows, (0.3, 1.2), max_cut=0.0, baseline="absent") is None


def test_the_command_reports_both_splits(tmp_path: Path) -> None:
    """`python -m perf turn-taking --limit 1`: the Piper voices, two pauses, both splits;
    the silence rule, the audio model alone and the served default."""
    from perf.__main__ import main
    from perf.turn_taking import served_default

    args = ["turn-taking", "--limit", "1", "--voices", "piper", "--pauses", "0.3", "1.2"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "turn_taking.json").read_text())
    rows = results["rows"]
    served = served_default()[0]
    assert "(default)" in served
    assert [(r["strategy"], r["split"]) for r in rows] == [
        ("silence 0.7", "dev"), ("silence 0.7", "test"), ("model", "dev"), ("model", "test"),
        (served, "dev"), (served, "test"),
    ]  # fmt: skip
    for r in rows:  # 2 voices x 1 question x 2 pauses; the question whole and 1 statement
        assert (r["heads"], r["finished"], r["finished_unended"]) == (4, 4, 0), r
        assert 0 < r["delay_p50_ms"] <= r["delay_p95_ms"] < 2500, r
    assert rows[0]["ended_by_model"] == 0.0  # silence alone ends its turns
    table = (tmp_path / "turn_taking.md").read_text()
    assert "| silence 0.7 | dev |" in table and "finished p50 / p95 ms" in table
    assert (tmp_path / "turn_taking_rows.csv").is_file()


def test_words_only_ranks_whole_questions_above_their_heads(tmp_path: Path) -> None:
    """`python -m perf turn-taking --words-only turn_words`: the served words model on the
    material's true words, per split; a scorer that could not tell a head from its whole
    question would rank them at AUC ~0.5."""
    from perf.__main__ import main
    from perf.turn_taking import _auc

    assert _auc(np.array([0.9, 0.2, 0.5, 0.5]), np.array([True, False, True, False])) == 0.875
    args = ["turn-taking", "--words-only", "turn_words", "--out", str(tmp_path)]
    assert main(args) == 0
    rows = json.loads((tmp_path / "words_only.json").read_text())["rows"]
    assert [(r["scorer"], r["split"]) for r in rows] == [
        ("turn_words", "dev"), ("turn_words", "test"),
    ]  # fmt: skip
    for r in rows:
        assert r["heads"] == 20 and r["finished"] > r["heads"], r
        assert r["auc"] > 0.8, r  # 0.92 / 0.96 when written
    assert "| turn_words | dev |" in (tmp_path / "words_only.md").read_text()


@pytest.mark.extended
def test_the_blend_averages_logits_and_the_cascade_asks_the_chat_model_in_doubt() -> None:
    """`--words-scorer blend cascade` (issue 43, fifth round): the blend is the weighted
    logit average of the regression's and the (shifted) chat model's answers, and ranks a
    finished question above its head; the cascade hands a confident regression answer on
    without the chat model (no CPU spent on it) and blends a doubtful one."""
    from perf.turn_taking import BLEND_WEIGHT, DOUBTFUL, Blend, _logit

    blend, cascade = Blend(), Blend(band=DOUBTFUL)
    finished, head = "Can you tell me where the nearest pharmacy is?", "Can you tell me."
    assert blend(finished) > blend(head)
    p, q = (blend.readers(model, finished)[0] for model in ("regression", "chat"))
    mixed = BLEND_WEIGHT * _logit(p) + (1 - BLEND_WEIGHT) * (_logit(q) + blend.readers.shift)
    assert blend(finished) == pytest.approx(1 / (1 + np.exp(-mixed)))
    assert blend("?!") is None and cascade("?!") is None
    for text in (finished, head, "Could I get a", "Thank you so much."):
        p, blended = blend.readers("regression", text)[0], blend(text)
        inside = DOUBTFUL[0] <= p <= DOUBTFUL[1]
        assert cascade(text) == (blended if inside else p), text
        assert cascade.costs[text][1] is inside
    cost = cascade.cost()
    assert cost["texts"] == 5 and cost["p50"] > 0 and 0.0 < cost["chat_asked"] < 1.0, cost
    assert blend.cost()["chat_asked"] == 0.8  # all but "?!"
