"""Does the end of turn cut users off, and how fast does it answer a finished turn?
(`python -m perf turn-taking`, reported as LiveKit's eot-bench reports turn detectors.)

The material is evals/turn_taking.py: questions that stop after a head that cannot stand
alone ("Can you tell me" | "where the nearest pharmacy is?", eight kinds) with P seconds of
silence there, and finished turns, spoken by the Piper voice, espeak-ng voices and people
(LibriVox), in a `dev` and a `test` split. Each strategy runs over the exported Silero VAD's
probabilities (in-process, as perf/endpointing.py runs it) and, for the model strategies,
the answers the gateway would get at each ask: Smart Turn's probability on the audio so far,
the transcript of the gateway's pass at the pause (Whisper in-process, over the audio at
SpeechPaused: every ask in a pause reads that one, as gateway/hearing.py does) and, for
fused strategies, the words' probability (turn_words) on it; an answer arrives
`--ask-latency-ms` after its ask, and not before its transcript (started at the pause) and
words are done. An answer depends only on the audio, so it is computed once per distinct
audio and reused across pauses and strategies.

Per strategy and split:

- per pause: the share of unfinished heads cut (a turn ended before the question's last
  word), overall and per voice family (piper, espeak, human);
- finished turns: the delay from the end of the last word (by energy) to the end of the turn,
  p50 / p95, and the share that the models' answer ended rather than the silence rule.

`choose` picks, among strategies run on `dev`, the one with the lowest finished-turn p50
that cuts at most 10 % of heads at every pause (when none does: the one that cuts the fewest
at its worst pause without answering finished turns later than `model`, today's default);
the table reports it on `test`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from evals.report import DEFAULT_OUT, save_results
from evals.turn_taking import FAMILIES, PAUSES, SAMPLE_RATE, SPLITS, Item, items
from perf.endpointing import ASK_LATENCY_MS, PAUSE_S, Answers, Scorer, endpoint_events

if TYPE_CHECKING:
    from avatar.endpointing import TurnEndStrategy

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "turn_taking"
LANGUAGE = "en"  # every voice of the material speaks English
MAX_CUT = 0.10  # a strategy may cut at most this share of heads at every pause
# ...on dev, at most this: settings at dev's edge of 10 % cut 13-16 % on test in the fourth,
# fifth and sixth rounds (docs/performance.md section 25), so dev keeps half as a margin
DEV_MAX_CUT = 0.05
# (label, a fresh strategy for each item, the words' scorer: None = decide(p, pause, text))
Strategy = tuple[str, Callable[[], "TurnEndStrategy"], Scorer | None]


def default_strategies() -> list[Strategy]:
    """Today's silence rule and the audio model with the transcript read by rule."""
    from avatar.end_of_turn import ModelEndpointer
    from avatar.endpointing import Endpointer

    return [
        ("silence 0.7", lambda: Endpointer(end_silence_s=0.7, pause_s=PAUSE_S), None),
        ("model", lambda: ModelEndpointer(pause_s=PAUSE_S), None),
    ]


# The fusion grids that `--fused` runs, `choose` picks from on dev, per words scorer
# (`--words-scorer`): (words_weight, complete_at, unfinished_below, unfinished_silence_s) of
# avatar.end_of_turn.Fusion. The chat model's cut turns score ~0.005, its finished ~0.3:
# its grid sits lower.
FUSION_GRIDS = {
    "turn_words": [
        (weight, complete, below, 1.8)
        for weight in (0.3, 0.5, 0.7)
        for complete in (0.5, 0.6, 0.7, 0.8)
        for below in (0.35, 0.5, 0.65)
    ],
    "smollm2": [
        (weight, complete, below, 1.8)
        for weight in (0.3, 0.5, 0.7)
        for complete in (0.3, 0.45, 0.6)
        for below in (0.01, 0.03, 0.1)
    ],
}
# the blend is on the regression's scale (_Readers.shift): the regression's grid with lower
# holds (its doubt is rarer); the served setting (0.7, 0.5, 0.65) is added by
# fused_strategies. Measured, not adopted (docs/performance.md section 25, fifth round:
# chosen on dev, it cut 13 % of the test heads against the regression's 9.8 %)
FUSION_GRIDS["blend"] = FUSION_GRIDS["cascade"] = [
    (weight, complete, below, 1.8)
    for weight in (0.5, 0.7)
    for complete in (0.5, 0.6)
    for below in (0.2, 0.35, 0.5)
]
# the setting whose timings are tried: the served default for turn_words, the one chosen
# on dev for the chat model (issue 43, fourth round)
TIMED_FUSION = {"smollm2": (0.7, 0.3, 0.1, 1.8)}


# ...and the timing grid, with that fusion: (the silences of the asks, the first also where
# the gateway's pass at the pause starts; the most silence that waits for an answer on its
# way: 0.7 = none, the silence rule's own)
TIMING_GRID = [
    ((0.2, 0.6), 0.7), ((0.2, 0.6), 1.2), ((0.1, 0.6), 0.7), ((0.1, 0.6), 1.2),
    ((0.064, 0.6), 1.2),
]  # fmt: skip


def fused_strategies(words: str = "turn_words") -> list[Strategy]:
    """THE PLACE for strategies that fuse the audio's answer with the words' (`--fused`):
    ModelEndpointer with each setting of `words`' grid at the default timing, and its timed
    fusion at each `TIMING_GRID` timing, its `decide` given the in-process probability of
    the transcript by the words scorer `words` (WORD_SCORERS) alone, without Whisper's end
    mark (as the grids were measured before it; `--end-mark-weight` reads it)."""
    from avatar.end_of_turn import ANSWER_WAIT_S, ASK_AT_S, Fusion, ModelEndpointer

    scorer = WORD_SCORERS[words]()
    served = Fusion()
    default = (
        (
            served.words_weight,
            served.complete_at,
            served.unfinished_below,
            served.unfinished_silence_s,
        ),
        (ASK_AT_S, ANSWER_WAIT_S),
    )
    timed = TIMED_FUSION.get(words, default[0])

    def strategy(setting: tuple[float, ...], timing: tuple[tuple[float, ...], float]) -> Strategy:
        (w, c, u, s), (ask_at, wait) = setting, timing
        label = f"fused{'' if words == 'turn_words' else f' {words}'} w{w:g} c{c:g} u{u:g} s{s:g}"
        if timing != default[1]:
            label += f" ask {'/'.join(f'{a:g}' for a in ask_at)} wait {wait:g}"
        fusion = Fusion(
            words_weight=w,
            complete_at=c,
            unfinished_below=u,
            unfinished_silence_s=s,
            end_mark_weight=0.0,
        )
        return (
            label,
            lambda: ModelEndpointer(
                pause_s=ask_at[0], ask_at_s=ask_at, answer_wait_s=wait, fusion=fusion
            ),
            scorer,
        )

    grid = FUSION_GRIDS[words]
    grid = grid if timed in grid else [timed, *grid]
    # the blends keep the served timing: their grid is the fusion's
    timings = [t for t in TIMING_GRID if t != default[1] and words in ("turn_words", "smollm2")]
    return [strategy(setting, default[1]) for setting in grid] + [
        strategy(timed, timing) for timing in timings
    ]


def audio_sure_strategies(sure_at: Sequence[float]) -> list[Strategy]:
    """The served default with the words' hold lifted where the audio is this sure
    (`--audio-sure-at`: avatar.end_of_turn.Fusion.audio_sure_at)."""
    from avatar.end_of_turn import Fusion, ModelEndpointer

    scorer = WORD_SCORERS["turn_words"]()

    def strategy(at: float) -> Strategy:
        fusion = Fusion(audio_sure_at=at)
        return (
            f"fused audio sure at {at:g}",
            lambda: ModelEndpointer(pause_s=PAUSE_S, fusion=fusion),
            scorer,
        )

    return [strategy(at) for at in sure_at]


def answer_wait_strategies(waits: Sequence[float]) -> list[Strategy]:
    """The served default with the silence rule waiting this long for an answer on its
    way (`--answer-wait-s`: ModelEndpointer's answer_wait_s; served: ANSWER_WAIT_S)."""
    from avatar.end_of_turn import ModelEndpointer

    scorer = WORD_SCORERS["turn_words"]()

    def strategy(wait: float) -> Strategy:
        return (
            f"fused, answer wait {wait:g} s",
            lambda: ModelEndpointer(pause_s=PAUSE_S, answer_wait_s=wait),
            scorer,
        )

    return [strategy(wait) for wait in waits]


# the fusion grid read with Whisper's end mark (`--end-mark-weight`): (words_weight,
# complete_at, unfinished_below) at the served hold
END_MARK_GRID = [
    (weight, complete, below)
    for weight in (0.5, 0.7)
    for complete in (0.5, 0.6)
    for below in (0.5, 0.65, 0.7, 0.75, 0.8)
]


def end_mark_strategies(weights: Sequence[float], either: bool = False) -> list[Strategy]:
    """The served default's fusion grid with the words read together with Whisper's end
    mark after the transcript (avatar.end_of_turn.Fusion): averaged with it at each weight
    (`end_mark_rule` "mean"), and with `either`, the larger of the two ("either")."""
    from avatar.end_of_turn import Fusion, ModelEndpointer

    scorer = WORD_SCORERS["turn_words"]()

    def strategy(fusion: Fusion) -> Strategy:
        f = fusion
        how = "either" if f.end_mark_rule == "either" else f"{f.end_mark_weight:g}"
        return (
            f"fused w{f.words_weight:g} c{f.complete_at:g} u{f.unfinished_below:g} end mark {how}",
            lambda: ModelEndpointer(pause_s=PAUSE_S, fusion=fusion),
            scorer,
        )

    readings = [{"end_mark_weight": weight} for weight in weights]
    readings += [{"end_mark_rule": "either"}] if either else []
    fusions = [
        Fusion(words_weight=w, complete_at=c, unfinished_below=u, **reading)
        for reading in readings
        for w, c, u in END_MARK_GRID
    ]
    return [strategy(f) for f in fusions if f != Fusion()]  # the served default: its own row


def served_default() -> Strategy:
    """The served default (`Fusion()`: the regression, Whisper's end mark at its served
    weight, the served timing): the row every other strategy is measured beside in the
    same run."""
    from avatar.end_of_turn import Fusion, ModelEndpointer

    f = Fusion()
    label = (
        f"fused w{f.words_weight:g} c{f.complete_at:g} u{f.unfinished_below:g} "
        f"s{f.unfinished_silence_s:g} end mark {f.end_mark_weight:g} (default)"
    )
    return (label, lambda: ModelEndpointer(pause_s=PAUSE_S), WORD_SCORERS["turn_words"]())


def words_scorer() -> Scorer:
    """The `turn_words` model in-process (the artifact Triton serves): the probability that
    a transcript's words are a finished turn; None when it has no words."""
    from avatar.turn_words import features
    from export.common import onnx_session
    from export.registry import ensure_all

    session = onnx_session(ensure_all(["turn_words"])["turn_words"] / "model.onnx")

    def score(text: str) -> float | None:
        row = features(text)
        if row is None:
            return None
        return float(session.run(["probability"], {"features": row[None]})[0].reshape(-1)[0])

    return score


def smollm2_scorer() -> Scorer:
    """The packaged SmolLM2-135M-Instruct read zero shot as LiveKit's detector reads its
    model (export/turn_words/chat_model.py): its exported graph with 8-bit weights, as it
    was measured served; measured, not adopted (docs/performance.md section 25)."""
    from export.turn_words.chat_model import scorer

    return scorer()


# The blend (issue 43, fifth round): the regression's and the chat model's answers averaged
# in logit space. The chat model's logit is moved onto the regression's scale first (its cut
# turns score ~0.005, its finished ~0.3): by the difference of the two means on the dev
# split's true words (_Readers.shift), so the regression's fusion grid applies to the blend
# and the cascade can hand the regression's own answer on.
BLEND_WEIGHT = 0.5  # the regression's weight (`--words-only blend blend-0.3 blend-0.7`)
# the cascade asks the chat model only where the regression doubts: p in this band
DOUBTFUL = (0.15, 0.9)


def _logit(p: float) -> float:
    from avatar.end_of_turn import logit

    return logit(p, 1e-6)


class _Readers:
    """The regression and the chat model in-process, each text read once by each: the
    probability, the CPU ms (this thread) and the wall seconds it took; shared by every
    blend."""

    _shared: _Readers | None = None

    def __init__(self) -> None:
        self.regression, self.chat = words_scorer(), smollm2_scorer()
        self.read: dict[tuple[str, str], tuple[float | None, float, float]] = {}
        self.shift = self._dev_shift()
        log.info("blend: the chat model's logit + %.3f (dev's true words)", self.shift)

    @classmethod
    def shared(cls) -> _Readers:
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def _dev_shift(self) -> float:
        """mean logit(regression) - mean logit(chat) over the dev split's true words (heads,
        whole questions, statements, recordings): the test split never sets it."""
        from evals.turn_taking import complete_turns, questions, recording_texts

        asked = questions("dev")
        texts = [q.head for q in asked] + [q.text for q in asked]
        texts += [t for t, _ in complete_turns("dev")] + recording_texts("dev")
        gaps = [
            _logit(p) - _logit(q)
            for p, q in ((self("regression", t)[0], self("chat", t)[0]) for t in texts)
            if p is not None and q is not None
        ]
        self.read.clear()  # costs are counted from the material's reads
        return float(np.mean(gaps))

    def __call__(self, model: str, text: str) -> tuple[float | None, float, float]:
        key = (model, text)
        if key not in self.read:
            started, wall = time.thread_time(), time.monotonic()
            p = (self.regression if model == "regression" else self.chat)(text)
            took = (time.thread_time() - started) * 1000, time.monotonic() - wall
            self.read[key] = (p, *took)
        return self.read[key]


class Blend:
    """A words scorer: sigmoid(weight * logit(regression) + (1 - weight) * (logit(chat) +
    the readers' shift)). With `band`, a cascade: the chat model is asked only when the
    regression's p is inside it; outside, the regression's p is the answer. `costs`: the CPU
    ms of each text's decision (the regression's, plus the chat model's where asked), and
    whether the chat model was asked."""

    def __init__(self, weight: float = BLEND_WEIGHT, band: tuple[float, float] | None = None):
        self.weight, self.band, self.readers = weight, band, _Readers.shared()
        self.costs: dict[str, tuple[float, bool, float]] = {}  # text: (CPU ms, chat, wall s)

    def seconds(self, text: str) -> float:
        """The seconds `text`'s decision costs, charged to its answer's arrival: the CPU
        time of one thread when its readers first read it (another blend may have read it
        since; and on a shared machine the wall clock counts the neighbours' work)."""
        return self.costs[text][0] / 1000

    def __call__(self, text: str) -> float | None:
        p, cost, wall = self.readers("regression", text)
        if p is None or (self.band is not None and not self.band[0] <= p <= self.band[1]):
            self.costs[text] = (cost, False, wall)
            return p
        q, chat_cost, chat_wall = self.readers("chat", text)
        self.costs[text] = (cost + chat_cost, True, wall + chat_wall)
        if q is None:
            return p
        mixed = self.weight * _logit(p) + (1 - self.weight) * (_logit(q) + self.readers.shift)
        return 1 / (1 + math.exp(-mixed))

    def cost(self) -> dict[str, float | None]:
        """CPU ms per decision over the texts read (mean, p50, p95) and the share that
        asked the chat model."""
        if not self.costs:
            return {"texts": 0, "mean": None, "p50": None, "p95": None, "chat_asked": None}
        ms = np.array([c for c, _, _ in self.costs.values()])
        return {
            "texts": len(ms),
            "mean": round(float(ms.mean()), 2),
            "p50": round(float(np.percentile(ms, 50)), 2),
            "p95": round(float(np.percentile(ms, 95)), 2),
            "chat_asked": _share([asked for _, asked, _ in self.costs.values()]),
        }


WORD_SCORERS: dict[str, Callable[[], Scorer]] = {
    "turn_words": words_scorer,
    "smollm2": smollm2_scorer,
    "blend": Blend,
    "cascade": lambda: Blend(band=DOUBTFUL),
    # the weights the blend's was chosen among, on dev's true words
    **{f"blend-{w:g}": functools.partial(Blend, w) for w in (0.3, 0.7)},
}


def words_only(names: Sequence[str]) -> list[dict]:
    """Each words scorer on the material's true words (no ASR, no audio), per split: heads
    (unfinished) against whole questions, statements and the LibriVox sentences (finished):
    AUC, and the finished turns a threshold that lets 10 % of the heads through would
    hold (scorer-agnostic: the probabilities need not be calibrated), with the CPU ms per
    text (one thread, p50)."""
    from evals.turn_taking import complete_turns, questions, recording_texts

    rows = []
    for name in names:
        scorer = WORD_SCORERS[name]()
        for split in SPLITS:
            asked = questions(split)
            texts = [(q.head, False) for q in asked] + [(q.text, True) for q in asked]
            texts += [(t, True) for t, _ in complete_turns(split)]
            texts += [(text, True) for text in recording_texts(split)]
            scored, took = [], []
            for text, whole in texts:
                started = time.thread_time()
                p = scorer(text)
                took.append((time.thread_time() - started) * 1000)
                if p is not None:
                    scored.append((p, whole))
            p = np.array([s for s, _ in scored])
            whole = np.array([w for _, w in scored])
            threshold = float(np.quantile(p[~whole], 1 - MAX_CUT))
            rows.append({
                "scorer": name,
                "split": split,
                "heads": int((~whole).sum()),
                "finished": int(whole.sum()),
                "auc": round(_auc(p, whole), 3),
                "finished_held_at_10pct_heads": _share(list(p[whole] <= threshold)),
                # a blend's readers are shared: its own first reads' cost, not the cache's
                "cpu_ms_p50": scorer.cost()["p50"] if isinstance(scorer, Blend)
                else round(float(np.percentile(took, 50)), 2),
            })  # fmt: skip
    return rows


def _auc(p: np.ndarray, positive: np.ndarray) -> float:
    """The chance that a positive scores above a negative (ties count half)."""
    wins = (p[positive][:, None] > p[~positive][None, :]).mean()
    ties = (p[positive][:, None] == p[~positive][None, :]).mean()
    return float(wins + ties / 2)


class _WithWords:
    """A strategy whose `decide(p, pause, text)` passes on `words=scorer(text)`."""

    def __init__(self, inner: TurnEndStrategy, answers: Answers, scorer: Scorer):
        self.inner, self.answers, self.scorer = inner, answers, scorer

    def step(self, chunk: np.ndarray, prob: float):
        return self.inner.step(chunk, prob)

    def decide(
        self,
        probability: float,
        pause: int,
        text: str | None = None,
        end_mark: float | None = None,
    ):
        words = None if text is None else self.answers.words(self.scorer, text)[0]
        return self.inner.decide(probability, pause, text, words=words, end_mark=end_mark)

    @property
    def detector(self):
        return self.inner.detector  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One strategy on one item."""

    cut: bool  # a turn ended before the last word (for a finished turn: more than one)
    delay_s: float | None  # finished: from the last word's end to the end of the turn
    ended_by: str | None  # finished: what ended the turn ("silence", "audio", "words")


def outcome(
    strategy: Strategy,
    item: Item,
    probs: np.ndarray,
    answers: Answers,
    ask_latency_s: float,
) -> Outcome:
    """Run `strategy` over `item` (an unfinished one only until its last word ends)."""
    from avatar.endpointing import TooShort, Utterance
    from avatar.vad import CHUNK, chunks

    _, factory, scorer = strategy
    endpointer = factory()
    if scorer is not None:
        endpointer = _WithWords(endpointer, answers, scorer)
    ends: list[tuple[int, str]] = []  # (sample at which a turn ended, what ended it)
    events = endpoint_events(
        endpointer, probs, chunks(item.audio), answers.asker(scorer), ask_latency_s
    )
    for index, happened in events:
        at = (index + 1) * CHUNK  # the chunk is in: the turn ends now
        if not item.finished and at >= item.end:
            break
        for event in happened:
            if isinstance(event, Utterance):
                ends.append((at, event.ended_by))
            elif isinstance(event, TooShort):
                ends.append((at, "too short"))
    if not item.finished:
        return Outcome(bool(ends), None, None)
    if not ends:
        return Outcome(False, None, None)
    at, ended_by = ends[-1]
    return Outcome(len(ends) > 1, (at - item.end) / SAMPLE_RATE, ended_by)


def _share(flags: Sequence[bool]) -> float | None:
    return round(float(np.mean(flags)), 3) if len(flags) else None


def _ms(delays: Sequence[float], q: float) -> int | None:
    return round(float(np.percentile(delays, q)) * 1000) if len(delays) else None


def summary(
    label: str, split: str, results: list[tuple[Item, Outcome]], pauses: Sequence[float]
) -> dict:
    """One row: cut shares per pause (overall, per family, per kind), finished delays."""
    heads = [(i, o) for i, o in results if not i.finished]
    whole = [(i, o) for i, o in results if i.finished]
    row: dict = {"strategy": label, "split": split, "heads": len(heads), "finished": len(whole)}
    for pause in pauses:
        row[f"cut_{pause:g}"] = _share([o.cut for i, o in heads if i.pause_s == pause])
    for family in FAMILIES:
        for pause in pauses:
            row[f"cut_{family}_{pause:g}"] = _share(
                [o.cut for i, o in heads if i.pause_s == pause and i.family == family]
            )
    for kind in sorted({i.kind for i, _ in heads}):
        row[f"cut_kind_{kind}"] = _share([o.cut for i, o in heads if i.kind == kind])
    delays = [o.delay_s for _, o in whole if o.delay_s is not None]
    row["delay_p50_ms"], row["delay_p95_ms"] = _ms(delays, 50), _ms(delays, 95)
    for family in FAMILIES:
        mine = [o.delay_s for i, o in whole if i.family == family and o.delay_s is not None]
        row[f"delay_{family}_p50_ms"] = _ms(mine, 50)
    ended = [o.ended_by for _, o in whole if o.ended_by is not None]
    row["ended_by_model"] = _share([e not in ("silence", "too short") for e in ended])
    row["finished_cut"] = _share([o.cut for _, o in whole])
    row["finished_unended"] = sum(o.delay_s is None for _, o in whole)
    return row


def run(
    strategies: Sequence[Strategy],
    material: Iterable[Item],
    pauses: Sequence[float] = PAUSES,
    ask_latency_ms: float = ASK_LATENCY_MS,
    answers_file: Path | None = None,
    *,
    transcript_ms: float | None = None,
) -> list[dict]:
    """Every strategy over every item (one at a time: the VAD once per item) -> one row per
    strategy and split. `answers_file`: the answers of an earlier run, reused, and this
    run's saved there (other strategies over the same material take seconds, not minutes).
    `transcript_ms`: each transcript at a pause takes this long (another machine's), not
    the time it took here."""
    from avatar.vad import onnx_vad, speech_probabilities
    from export.common import onnx_session
    from export.registry import ensure_all
    from perf.endpointing import _transcriber

    built = ensure_all(["vad", "turn_detector"])
    vad = onnx_vad(onnx_session(built["vad"] / "model.onnx"))
    detector = onnx_session(built["turn_detector"] / "model.onnx")
    # the session's language is known from its earlier turns (the gateway passes it): a
    # short head left to detection comes back as Japanese or Korean words
    transcript_s = None if transcript_ms is None else transcript_ms / 1000
    answers = Answers(detector, _transcriber(LANGUAGE), answers_file, transcript_s)
    results: dict[tuple[str, str], list[tuple[Item, Outcome]]] = {}
    started, count = time.monotonic(), 0
    for item in material:
        probs = speech_probabilities(vad, item.audio)
        for strategy in strategies:
            result = outcome(strategy, item, probs, answers, ask_latency_ms / 1000)
            results.setdefault((strategy[0], item.split), []).append((item, result))
        count += 1
        if count % 200 == 0:
            log.info("%d items, %s, %.0f s", count, dict(answers.calls), time.monotonic() - started)
    log.info("%d items in %.0f s; answers: %s", count, time.monotonic() - started, answers.calls)
    answers.save()
    return [
        summary(label, split, results[(label, split)], pauses)
        for label, _, _ in strategies
        for split in SPLITS
        if (label, split) in results
    ]


def decision_cost(repeats: int = 50) -> dict[str, float]:
    """CPU ms (this thread, one ONNX Runtime thread) of one decision's answers, p50 / p95:
    the words' (features + turn_words) and the audio's (log-mel + turn_detector, 3 s)."""
    from avatar.end_of_turn import turn_features
    from avatar.turn_words import features
    from export.common import onnx_session
    from export.registry import ensure_all

    built = ensure_all(["turn_words", "turn_detector"])
    words = onnx_session(built["turn_words"] / "model.onnx")
    detector = onnx_session(built["turn_detector"] / "model.onnx")
    audio = np.random.default_rng(0).normal(0, 0.1, 3 * SAMPLE_RATE).astype(np.float32)
    text = "Can you tell me where the nearest pharmacy is?"
    calls = {
        "words": lambda: words.run(["probability"], {"features": features(text)[None]}),
        "audio": lambda: detector.run(
            ["probability"], {"input_features": turn_features(audio)[None]}
        ),
    }
    out = {}
    for name, call in calls.items():
        took = []
        for _ in range(repeats):
            started = time.thread_time()
            call()
            took.append((time.thread_time() - started) * 1000)
        out[f"{name}_cpu_ms_p50"] = round(float(np.percentile(took, 50)), 3)
        out[f"{name}_cpu_ms_p95"] = round(float(np.percentile(took, 95)), 3)
    return out


def pause_wer(pauses: Sequence[float]) -> dict[str, dict[str, float]]:
    """{voice: {pause: WER}} of the transcript a turn starts from (the pass at the last
    pause of the utterance, Whisper in-process as `run`'s) with the pass at each pause
    length, on the packaged human recordings and the Piper voice's clips: whether an
    earlier pass hears less."""
    from avatar.endpointing import Endpointer, SpeechPaused
    from avatar.vad import chunks, onnx_vad, speech_probabilities
    from evals.clips import clips
    from evals.recordings import human_clips
    from evals.wer import corpus_wer
    from export.common import onnx_session
    from export.registry import ensure_all
    from perf.endpointing import _transcriber

    vad = onnx_vad(onnx_session(ensure_all(["vad"])["vad"] / "model.onnx"))
    transcribe = _transcriber(LANGUAGE)
    lead, tail = np.zeros(int(0.3 * SAMPLE_RATE), np.float32), np.zeros(2 * SAMPLE_RATE, np.float32)
    out: dict[str, dict[str, float]] = {}
    for voice, material in (("human", human_clips()), ("piper", clips())):
        heard: dict[float, list[str]] = {pause: [] for pause in pauses}
        for clip in material:
            audio = np.concatenate([lead, clip.audio, tail])
            probs = speech_probabilities(vad, audio)
            for pause in pauses:
                endpointer, last = Endpointer(pause_s=pause), np.zeros(0, np.float32)
                for chunk, prob in zip(chunks(audio), probs, strict=True):
                    paused = [
                        e
                        for e in endpointer.step(chunk, float(prob))
                        if isinstance(e, SpeechPaused)
                    ]
                    last = paused[-1].audio if paused else last
                heard[pause].append(transcribe(last)[0] if len(last) else "")
        texts = [c.text for c in material]
        out[voice] = {f"{p:g}": round(corpus_wer(texts, heard[p]), 4) for p in pauses}
    return out


def choose(
    rows: Sequence[dict],
    pauses: Sequence[float],
    max_cut: float = DEV_MAX_CUT,
    baseline: str = "model",
    slack: float = 1.05,
) -> str | None:
    """On the dev split: the strategy with the lowest finished-turn p50 among those that cut
    at most `max_cut` of the heads at every pause (`DEV_MAX_CUT`: the test split's budget
    `MAX_CUT` less a margin); when none does, the one that cuts the
    fewest heads at its worst pause among those whose finished-turn p50 is within `slack` of
    `baseline`'s (answering no later than today). None when neither finds one."""
    dev = [r for r in rows if r["split"] == "dev" and r["delay_p50_ms"] is not None]

    def worst(r: dict) -> float:
        return max((r[f"cut_{p:g}"] or 0.0) for p in pauses)

    fit = [r for r in dev if worst(r) <= max_cut]
    if fit:
        return min(fit, key=lambda r: r["delay_p50_ms"])["strategy"]
    base = next((r for r in dev if r["strategy"] == baseline), None)
    if base is None:
        return None
    fast = [r for r in dev if r["delay_p50_ms"] <= base["delay_p50_ms"] * slack]
    return min(fast, key=lambda r: (worst(r), r["delay_p50_ms"]))["strategy"] if fast else None


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def markdown(rows: Sequence[dict], pauses: Sequence[float], chosen: str | None) -> str:
    head = " | ".join(f"cut {p:g} s" for p in pauses)
    lines = [
        f"| strategy | split | {head} | finished p50 / p95 ms | ended by the model |",
        "|---|---|" + "---:|" * (len(pauses) + 2),
    ]
    for r in rows:
        name = r["strategy"] + (" **(chosen on dev)**" if r["strategy"] == chosen else "")
        cuts = " | ".join(_pct(r[f"cut_{p:g}"]) for p in pauses)
        lines.append(
            f"| {name} | {r['split']} | {cuts} | {r['delay_p50_ms']} / {r['delay_p95_ms']} "
            f"| {_pct(r['ended_by_model'])} |"
        )
    lines += [
        "",
        f"| strategy | split | family | {head} | finished p50 ms |",
        "|---|---|---|" + "---:|" * (len(pauses) + 1),
    ]
    for r in rows:
        for family in FAMILIES:
            cuts = [r.get(f"cut_{family}_{p:g}") for p in pauses]
            if all(c is None for c in cuts):
                continue
            lines.append(
                f"| {r['strategy']} | {r['split']} | {family} | "
                + " | ".join(_pct(c) for c in cuts)
                + f" | {r.get(f'delay_{family}_p50_ms')} |"
            )
    verdict = (
        f"Chosen on dev (at most {DEV_MAX_CUT:.0%} of heads cut at every pause, a margin under "
        f"the target's {MAX_CUT:.0%}, then the lowest "
        "finished p50; when none cuts so few, the fewest cut at the worst pause among those "
        f"with a finished p50 within 5 % of `model`'s): {chosen}."
        if chosen
        else "No strategy chosen on dev."
    )
    return "\n".join([*lines, "", verdict])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", choices=["dev", "test", "both"], default="both")
    parser.add_argument(
        "--voices", default=",".join(FAMILIES), help="voice families: piper,espeak,human"
    )
    parser.add_argument("--pauses", type=float, nargs="+", default=list(PAUSES))
    parser.add_argument(
        "--limit", type=int, help="at most N questions, statements and recordings per voice"
    )
    parser.add_argument("--ask-latency-ms", type=float, default=ASK_LATENCY_MS)
    parser.add_argument(
        "--fused", action="store_true", help="also the strategies of fused_strategies()"
    )
    parser.add_argument(
        "--words-scorer",
        choices=sorted(FUSION_GRIDS),
        nargs="+",
        default=["turn_words"],
        help="the words scorers the fused strategies read (turn_words: the served one; any "
        "other is run beside the served default)",
    )
    parser.add_argument(
        "--answers",
        type=Path,
        help="a file of the models' answers to reuse and update (same material, same models)",
    )
    parser.add_argument(
        "--pause-wer",
        type=float,
        nargs="+",
        metavar="S",
        help="also the WER of the transcript a turn starts from with the pass at each pause",
    )
    parser.add_argument(
        "--words-only",
        nargs="+",
        choices=sorted(WORD_SCORERS),
        metavar="SCORER",
        help="only compare words scorers on the material's true words (no ASR): "
        + ", ".join(sorted(WORD_SCORERS)),
    )
    parser.add_argument(
        "--audio-sure-at",
        nargs="*",
        type=float,
        default=[],
        help="also the served default with the words' hold lifted where the audio "
        "model is at least this sure (each value its own strategy)",
    )
    parser.add_argument(
        "--end-mark-weight",
        nargs="*",
        type=float,
        default=[],
        help="also the served default's fusion grid with the words read together "
        "with Whisper's end mark at each weight (Fusion.end_mark_weight)",
    )
    parser.add_argument(
        "--answer-wait-s",
        nargs="*",
        type=float,
        default=[],
        help="also the served default with the silence rule waiting this long for an answer "
        "on its way (each value its own strategy)",
    )
    parser.add_argument(
        "--end-mark-either",
        action="store_true",
        help="also that grid with the words read as the larger of turn_words' answer and "
        "Whisper's end mark (Fusion.end_mark_rule 'either': both must doubt to hold)",
    )
    parser.add_argument(
        "--transcript-ms",
        type=float,
        help="every transcript at a pause takes this long (e.g. the GPU path's, from "
        "`perf gpu-stages --sessions`), instead of its time on this machine",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    if args.words_only:
        rows = words_only(args.words_only)
        lines = [
            "| scorer | split | heads / finished | AUC | finished held where 10 % of heads "
            "pass | CPU ms / text p50 |",
            "|---|---|---|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['scorer']} | {r['split']} | {r['heads']} / {r['finished']} | {r['auc']} "
                f"| {_pct(r['finished_held_at_10pct_heads'])} | {r['cpu_ms_p50']} |"
            )
        save_results(args.out, "words_only", {"rows": rows}, "\n".join(lines))
        return 0
    families = tuple(f.strip() for f in args.voices.split(",") if f.strip())
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise SystemExit(f"--voices: unknown families {sorted(unknown)} (of {FAMILIES})")
    # the served default always, every other strategy beside it in the same run
    strategies, blends = [*default_strategies(), served_default()], {}
    if args.fused:
        for words in args.words_scorer:
            strategies += fused_strategies(words)
            if isinstance(strategies[-1][2], Blend):
                blends[words] = strategies[-1][2]
    if args.audio_sure_at:
        strategies += audio_sure_strategies(args.audio_sure_at)
    if args.answer_wait_s:
        strategies += answer_wait_strategies(args.answer_wait_s)
    if args.end_mark_weight or args.end_mark_either:
        strategies += end_mark_strategies(args.end_mark_weight, args.end_mark_either)
    if args.fused and len(strategies) == 3:
        log.warning("--fused: no fused strategies in this tree (fused_strategies() is empty)")
    pauses = tuple(args.pauses)
    split = None if args.split == "both" else args.split
    started = time.monotonic()
    material = items(split, families, pauses, args.limit)
    rows = run(
        strategies,
        material,
        pauses,
        args.ask_latency_ms,
        args.answers,
        transcript_ms=args.transcript_ms,
    )
    chosen = choose(rows, pauses)
    cost = decision_cost()
    table = markdown(rows, pauses, chosen) + (
        "\n\nCPU per decision (one thread; p50 / p95 ms): words "
        f"{cost['words_cpu_ms_p50']} / {cost['words_cpu_ms_p95']}, audio "
        f"{cost['audio_cpu_ms_p50']} / {cost['audio_cpu_ms_p95']}."
    )
    for words, blend in blends.items():
        cost[words] = blend.cost()
        table += (
            f"\n{words}: CPU ms per decision over the {cost[words]['texts']} transcripts read "
            f"(mean / p50 / p95): {cost[words]['mean']} / {cost[words]['p50']} / "
            f"{cost[words]['p95']}; the chat model asked for {_pct(cost[words]['chat_asked'])}."
        )
    if args.pause_wer:
        wer = pause_wer(args.pause_wer)
        results_wer = "; ".join(
            f"{voice} " + ", ".join(f"{p} s {w:.2%}" for p, w in by.items())
            for voice, by in wer.items()
        )
        table += f"\n\nWER of the transcript at the pause (pass at): {results_wer}."
    results = {
        "rows": rows,
        "chosen_on_dev": chosen,
        "decision_cost": cost,
        "pause_wer": wer if args.pause_wer else None,
        "settings": {
            "split": args.split,
            "voices": list(families),
            "pauses": list(pauses),
            "limit": args.limit,
            "ask_latency_ms": args.ask_latency_ms,
            "transcript_ms": args.transcript_ms,
            "seconds": round(time.monotonic() - started),
        },
    }
    save_results(args.out, "turn_taking", results, table)
    from evals.report import write_rows

    write_rows(rows, args.out / "turn_taking_rows")
    return 0
