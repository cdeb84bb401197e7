"""Generation figures for `python -m export.llm --report` (printed, never asserted): time
to first token with and without the prefix cache, aggregate tokens/s at 1/4/8 streams."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from avatar.llm.decoder import OrtDecoder
from avatar.llm.engine import DEFAULT_PERSONA, ChatEngine, EngineConfig
from avatar.llm.sampling import SamplingParams
from avatar.llm.scheduler import Event
from avatar.llm.template import Message
from avatar.llm.tokenizer import Tokenizer

LONG_PERSONA = DEFAULT_PERSONA + (
    " You work at the front desk of the Harbour View Hotel. Check-in is from 3 pm and "
    "check-out until 11 am. Breakfast is served from 7 to 10 am in the Lighthouse room on "
    "the ground floor. The spa on the second floor opens at 9 am and closes at 9 pm; "
    "bookings are made at the desk. Parking costs 20 euros a night in the garage under the "
    "building. The nearest train station is a ten minute walk along the river. Guests can "
    "borrow umbrellas, phone chargers and city maps at the desk. Always be polite, never "
    "invent prices you were not told, and offer to call a colleague for anything else."
)
QUESTIONS = (
    "Hello! When can I check in?",
    "Where is breakfast served?",
    "How much is parking?",
    "Can I borrow an umbrella?",
    "How do I get to the station?",
    "When does the spa open?",
    "Is there a gym?",
    "Can you call me a taxi?",
)


def _engine(folder: Path, threads: int, persona: str, cache_entries: int) -> ChatEngine:
    config = EngineConfig(
        persona=persona,
        prefix_cache_entries=cache_entries,
        sampling=SamplingParams(seed=0, max_tokens=48),
    )
    return ChatEngine(OrtDecoder(folder / "model.onnx", threads), Tokenizer(folder), config)


def _turn(question: str) -> str:
    return json.dumps([{"role": "user", "content": question}])


def time_to_first_token(folder: Path, threads: int, persona: str, cached: bool) -> float:
    """Median ms from submit to the first token over 5 different questions (warmed up)."""
    eng = _engine(folder, threads, persona, 16 if cached else 0)
    next(eng.chat(_turn("Hi"), "", json.dumps({"max_tokens": 1})), None)  # warm-up + cache
    eng.scheduler.run_until_idle()
    ttfts = []
    for question in QUESTIONS[:5]:
        *_, last = eng.chat(_turn(question), "", json.dumps({"max_tokens": 1}))
        ttfts.append(last.stats["ttft_ms"])
    return statistics.median(ttfts)


def tokens_per_second(folder: Path, threads: int, streams: int) -> tuple[float, float]:
    """(aggregate tokens/s, mean decode batch) with `streams` concurrent generations."""
    eng = _engine(folder, threads, DEFAULT_PERSONA, 16)
    tokens = 0

    def emit(event: Event) -> None:
        nonlocal tokens
        if event.finish_reason:
            tokens += int(event.stats["completion_tokens"])

    started = time.monotonic()
    for i in range(streams):
        sampling = json.dumps({"seed": i, "max_tokens": 48})
        eng.submit(eng.parse(_turn(QUESTIONS[i % len(QUESTIONS)]), "", sampling), emit)
    eng.scheduler.run_until_idle()
    elapsed = time.monotonic() - started
    return tokens / elapsed, eng.scheduler.batch_rows / max(1, eng.scheduler.steps)


def print_generation_figures(folder: Path, threads: int = 1) -> None:
    tokenizer = Tokenizer(folder)
    print(f"time to first token (median of 5 questions, {threads} ORT thread):")
    for label, persona in (("short persona", DEFAULT_PERSONA), ("hotel persona", LONG_PERSONA)):
        system = tokenizer.template.render(
            [Message("system", persona)],
            add_generation_prompt=False,
        )
        n = len(tokenizer.encode(system))
        cold = time_to_first_token(folder, threads, persona, cached=False)
        warm = time_to_first_token(folder, threads, persona, cached=True)
        print(
            f"  {label} ({n} system tokens): {cold:6.1f} ms without prefix cache, "
            f"{warm:6.1f} ms with"
        )
    print("aggregate tokens/s (sampled, 48 tokens max per stream, prefill included):")
    for streams in (1, 4, 8):
        rate, batch = tokens_per_second(folder, threads, streams)
        print(f"  {streams} streams: {rate:6.1f} tokens/s (mean decode batch {batch:.1f})")
