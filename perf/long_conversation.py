"""A long conversation's first tokens (`python -m perf long-conversation`): one session asks
the live check's questions (perf.latency.question_clips' texts) one after another through the
packaged chat engine in-process (the served `llm` model's settings, its decoder and prefix
cache), for each `--keep-share` (EngineConfig.history_keep_share) in one run.

Per turn: the prompt's tokens, how many of them the decoder's cache held, the first
token's time. Once the context is full older turns are dropped: one at a time (keep share
1.0) the prompt's prefix changes at every turn and the whole history is read again; down
to a share of the budget, the next turns extend the same prefix.
Results: build/perf/long_conversation/ (JSON + a markdown table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from evals.report import DEFAULT_OUT, save_results

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "long_conversation"
SESSION = "long-conversation"


def conversation(keep_share: float, texts: Sequence[str], threads: int) -> list[dict]:
    """One session through a fresh engine: a row per turn."""
    from avatar.llm.cache import PrefixCache
    from avatar.llm.decoder import OrtDecoder
    from avatar.llm.engine import ChatEngine
    from avatar.llm.sequences import KvCacheSequences
    from avatar.llm.tokenizer import Tokenizer
    from avatar.pipeline.local import _SequenceAtATime, sentence_embedder
    from serving.served import local_config, local_models

    models = local_models()
    config = local_config().llm
    embed = sentence_embedder(models.emotion_encoder, 1) if models.emotion_encoder else None
    config = dataclasses.replace(config, history_keep_share=keep_share, embed=embed)
    sequences = KvCacheSequences(
        OrtDecoder(models.llm_decoder, threads), PrefixCache(config.prefix_cache_entries)
    )
    decoder = _SequenceAtATime(sequences, config.max_batch)
    engine = ChatEngine(decoder, Tokenizer(models.llm_decoder.parent), config)
    sampling = json.dumps({"max_tokens": config.sampling.max_tokens, "seed": 1})
    rows = []
    engine.backend.start()
    try:
        for turn, text in enumerate(texts):
            started, first, stats = time.monotonic(), None, {}
            messages = json.dumps([{"role": "user", "content": text}])
            for event in engine.chat(messages, SESSION, sampling):
                if first is None and event.chunks:
                    first = time.monotonic() - started
                if event.finish_reason is not None:
                    stats = event.stats or {}
            rows.append({
                "keep_share": keep_share,
                "turn": turn,
                "prompt_tokens": stats.get("prompt_tokens"),
                "cached_tokens": stats.get("cached_tokens"),
                "first_token_ms": None if first is None else round(first * 1000),
            })  # fmt: skip
            log.info("keep %g, turn %d: %s", keep_share, turn, rows[-1])
    finally:
        engine.backend.stop()
        decoder.pool.shutdown()
    return rows


def summary(rows: Sequence[dict], from_turn: int) -> dict:
    first = np.array([r["first_token_ms"] for r in rows if r["first_token_ms"] is not None])
    late = np.array(
        [
            r["first_token_ms"]
            for r in rows
            if r["turn"] >= from_turn and r["first_token_ms"] is not None
        ]
    )
    full = [r for r in rows if r["cached_tokens"] is not None and r["prompt_tokens"]]
    return {
        "keep_share": rows[0]["keep_share"],
        "turns": len(rows),
        "first_token_p50_ms": round(float(np.percentile(first, 50))),
        "first_token_p95_ms": round(float(np.percentile(first, 95))),
        "late_p50_ms": round(float(np.percentile(late, 50))) if len(late) else None,
        "late_p95_ms": round(float(np.percentile(late, 95))) if len(late) else None,
        # turns whose prompt the cache held less than half of: the history read again
        "reread_turns": sum(r["cached_tokens"] < r["prompt_tokens"] / 2 for r in full),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=30, help="questions, repeated in order")
    parser.add_argument(
        "--keep-share",
        type=float,
        nargs="+",
        default=[1.0, 0.5],
        help="EngineConfig.history_keep_share values, each its own conversation (1.0: one "
        "turn at a time, as before)",
    )
    parser.add_argument("--from-turn", type=int, default=10, help="'late' turns start here")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from perf.latency import question_clips

    texts = [clip.text for _, clip in question_clips()]
    texts = [texts[i % len(texts)] for i in range(args.turns)]
    rows = [r for share in args.keep_share for r in conversation(share, texts, args.threads)]
    summaries = [
        summary([r for r in rows if r["keep_share"] == share], args.from_turn)
        for share in args.keep_share
    ]
    lines = [
        f"| keep share | turns | first token p50 / p95 ms | turns {args.from_turn}+ p50 / p95 "
        "ms | turns that read the history again |",
        "|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['keep_share']:g} | {s['turns']} | {s['first_token_p50_ms']} / "
            f"{s['first_token_p95_ms']} | {s['late_p50_ms']} / {s['late_p95_ms']} | "
            f"{s['reread_turns']} |"
        )
    save_results(args.out, "long_conversation", {"rows": rows, "summaries": summaries},
                 "\n".join(lines))  # fmt: skip
    return 0
