"""Measures of a decoder's greedy decoding (`avatar.llm.decoder.Decoder`): token agreement
of its continuations with a reference's on persona chat prompts, perplexity on token rows,
and the time of one decode step. The export verifies its FP32 graph with them against
PyTorch (export/llm/verify.py) and asks `int8_gate` for its INT8 variant's verdict
(export/llm/recipe.py).

The INT8 gate measures the task: the model's perplexity on held-out text (is it a worse
language model?) and the first token of each persona reply (does the avatar start its
answers the same way?). Greedy 32-token identity and first-sentence identity are recorded,
not gated: replies are sampled (temperature 0.7, top-p 0.9), so a continuation that parts
at a near-tie is as good an answer, and FP32's own batched path parts there too on the
server (docs/performance.md 3: 25/30 identical replies)."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from avatar.llm.cache import common_prefix
from avatar.llm.decoder import Decoder, greedy, positions
from avatar.llm.template import Message, with_persona
from evals.gate import side_by_side, verdict

PERSONA = "You are Mia, a friendly receptionist. Answer in one or two short sentences."
PROMPTS = (
    "Hello! Who are you?",
    "What is the capital of France?",
    "Can you tell me a joke?",
    "How do I get to the train station?",
    "What time does the office open?",
    "Name three colours of the rainbow.",
    "What is two plus two?",
    "Describe the weather on a sunny day.",
    "Why is the sky blue?",
    "Give me a tip for a job interview.",
    "What should I eat for breakfast?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "What is your favourite book?",
    "Explain what a computer is to a child.",
    "Where can I park my car?",
    "Recommend a movie for tonight.",
    "How do you say thank you in Spanish?",
    "What is the boiling point of water?",
    "Tell me something interesting about cats.",
    "Is it going to rain tomorrow?",
    "What are the benefits of exercise?",
)
MAX_PERPLEXITY_RISE = 0.01  # relative, on the held-out paragraphs
MIN_FIRST_TOKEN = 0.95  # of the persona prompts, greedy, batch 1


def chat_prompts(tokenizer: Any, count: int = 20) -> list[list[int]]:
    """`count` persona chat prompts as token ids (tokenizer: avatar.llm.tokenizer.Tokenizer)."""
    texts = [
        tokenizer.template.render(with_persona([Message("user", p)], PERSONA))
        for p in PROMPTS[:count]
    ]
    return [tokenizer.encode(t) for t in texts]


@dataclasses.dataclass
class Agreement:
    """Token agreement of a candidate's greedy continuations with a reference's."""

    prompts: int
    tokens: int
    exact: int  # prompts whose continuation is identical
    first_token: int  # prompts whose first token is identical
    mean_prefix: float  # mean fraction of leading tokens that agree

    @classmethod
    def of(cls, ref: list[list[int]], got: list[list[int]]) -> Agreement:
        prefix = [common_prefix(r, g) / len(r) for r, g in zip(ref, got, strict=True)]
        return cls(
            len(ref),
            len(ref[0]),
            sum(r == g for r, g in zip(ref, got, strict=True)),
            sum(r[0] == g[0] for r, g in zip(ref, got, strict=True)),
            float(np.mean(prefix)),
        )

    @property
    def all_equal(self) -> bool:
        return self.exact == self.prompts


def greedy_rows(decoder: Decoder, prompts: list[list[int]], new: int, batch: int, pad: int):
    """Greedy continuations, `batch` prompts at a time (mixed lengths, left padded)."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        out += greedy(decoder, prompts[start : start + batch], new, pad)
    return out


def step_ms(decoder: Decoder, batch: int, past_len: int = 64, steps: int = 12) -> float:
    """Median ms of one decode step (1 new token per row) with a past of `past_len`."""
    layout = decoder.layout
    shape = (batch, layout.kv_heads, past_len, layout.head_dim)
    past = [np.zeros(shape, np.float32) for _ in range(2 * layout.layers)]
    mask = np.ones((batch, past_len + 1), np.int64)
    ids = np.ones((batch, 1), np.int64)
    pos = positions(mask, 1)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        decoder.step(ids, mask, pos, past)
        times.append((time.perf_counter() - started) * 1000)
    return float(np.median(times[2:]))


def perplexity(decoder: Decoder, rows: Sequence[Sequence[int]]) -> float:
    """exp(mean next-token negative log-likelihood) over token rows, each one prefill."""
    total, count = 0.0, 0
    for row in rows:
        ids = np.asarray([row], np.int64)
        mask = np.ones_like(ids)
        logits, _ = decoder.step(ids, mask, positions(mask, ids.shape[1]), decoder.layout.empty(1))
        scores = logits[0, :-1].astype(np.float64)
        scores -= scores.max(axis=-1, keepdims=True)
        scores -= np.log(np.exp(scores).sum(axis=-1, keepdims=True))
        total -= float(scores[np.arange(len(row) - 1), np.asarray(row[1:])].sum())
        count += len(row) - 1
    return float(np.exp(total / count))


def first_sentence(text: str) -> list[str]:
    """The words of a text's first sentence, lower case, without punctuation."""
    head = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return re.sub(r"[^a-z0-9' ]", " ", head.lower()).split()


def int8_gate(
    decoders: dict[str, Decoder], tokenizer: Any, prompts: list[list[int]], new: int
) -> dict:
    """The INT8 gate of `decoders` {"fp32": ..., "int8": ...} on held-out perplexity and the
    first greedy token of each of `prompts` (`new` tokens each, at batch 1); greedy and
    first-sentence agreement, row independence and the decode step's speed recorded beside."""
    from evals.sentences import load_sentences

    fp32, int8 = decoders["fp32"], decoders["int8"]
    pad = tokenizer.pad_id
    record: dict = {}
    rows = {}
    for label, batch in (("batch1", 1), ("batch5_left_padded", 5)):
        ref = greedy_rows(fp32, prompts, new, batch, pad)
        got = rows[batch] = greedy_rows(int8, prompts, new, batch, pad)
        record[label] = dataclasses.asdict(Agreement.of(ref, got))
        if batch == 1:
            same = [
                first_sentence(tokenizer.decode(a)) == first_sentence(tokenizer.decode(b))
                for a, b in zip(ref, got, strict=True)
            ]
            record["first_sentence_same"] = f"{sum(same)}/{len(same)}"
    # int8 compute rounds a row differently alone and in a batch (FP32 rows do not depend on
    # their batch): recorded, so a deployment that needs batch-independent greedy replies
    # knows to serve FP32
    record["rows_independent"] = dataclasses.asdict(Agreement.of(rows[1], rows[5]))
    texts = load_sentences()["heldout"][0]  # 105 sentences the LLM was not tuned on
    held = [tokenizer.encode(" ".join(texts[i : i + 5])) for i in range(0, len(texts), 5)]
    ppl = {name: perplexity(decoder, held) for name, decoder in decoders.items()}
    record["perplexity"] = {k: round(v, 3) for k, v in ppl.items()}
    record["heldout_tokens"] = sum(len(r) for r in held)
    record["step_ms_1_thread"] = side_by_side(
        lambda name, batch: step_ms(decoders[name], batch), rounds=3, digits=1
    )
    first = record["batch1"]["first_token"] / record["batch1"]["prompts"]
    rise = ppl["int8"] / ppl["fp32"] - 1.0
    failures = []
    if rise > MAX_PERPLEXITY_RISE:
        failures.append(f"perplexity +{rise:.2%} > +{MAX_PERPLEXITY_RISE:.0%}")
    if first < MIN_FIRST_TOKEN:
        failures.append(f"first tokens as FP32 {first:.2f} < {MIN_FIRST_TOKEN}")
    passed = (
        f"perplexity {ppl['int8']:.2f} vs FP32 {ppl['fp32']:.2f} ({rise:+.2%}, at most "
        f"+{MAX_PERPLEXITY_RISE:.0%}), first tokens as FP32 {first:.2f} (>= {MIN_FIRST_TOKEN})"
    )
    return {**record, **verdict(failures, passed)}
