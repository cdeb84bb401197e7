"""`python -m perf knowledge`: does the avatar state the operator's facts?

A fictional venue (evals/knowledge/venue/: a hotel, its spa, restaurant, bar, policies and
activities in Markdown and plain text) and questions of our own writing
(evals/knowledge/questions.json), each with the phrases of which one must appear in the
reply (a price, a time, a name). Each question is one `run_turn` in a new session over
the in-process stages (`avatar.pipeline.local`: the packaged SmolLM2-135M, the served
persona, sampling and reply budget of three sentences, retrieval by the emotion
encoder's all-MiniLM-L6-v2 graph), with the documents and without. The reply is the one
the turn speaks (after `spoken_text` and the sentence budget); TTS is replaced by
silence here because it does not change the words and would triple the run time.

Rows (`--variants`):
  none        no documents, the served sampling: what the model knows of the venue
  documents   the shipped knowledge settings (passages, placement, knowledge sampling)
  served-sampling  the documents with the llm's served sampling (temperature 0.7,
              repetition penalty 1.1) instead of the knowledge sampling
  two-passages     the documents, two passages per turn
  focus-1, focus-2  the best passage cut to its 1 or 2 sentences nearest the question

Also, with no LLM: retrieval precision@1 and recall@3 (the passage holding the expected
phrase among the first k), which bound what any LLM can answer.
Results: build/perf/knowledge/knowledge.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from avatar.knowledge import KnowledgeBase, KnowledgeConfig
from avatar.pipeline import Speech, Stages, parse_turn, run_turn
from evals.report import DEFAULT_OUT, machine, save_results

log = logging.getLogger(__name__)

DATA = Path(__file__).resolve().parent.parent / "evals" / "knowledge"
VENUE = DATA / "venue"
QUESTIONS = DATA / "questions.json"
OUT = DEFAULT_OUT / "knowledge"
VARIANTS = ("none", "documents", "served-sampling", "two-passages", "focus-1", "focus-2")


@dataclasses.dataclass(frozen=True)
class Question:
    question: str
    expect: tuple[str, ...]  # one of these (case-insensitive) must be in the reply

    def stated(self, reply: str) -> bool:
        reply = reply.lower()
        return any(phrase.lower() in reply for phrase in self.expect)


def load_questions(path: Path = QUESTIONS) -> list[Question]:
    return [Question(q["question"], tuple(q["expect"])) for q in json.loads(path.read_text())]


def silent_speech(text: str, request: Any) -> Iterator[Speech]:
    """A stand-in for TTS: 0.1 s of silence per piece, no phonemes."""
    yield Speech(np.zeros(2205, np.float32), 22050, [], np.zeros(0), np.zeros(0), text)


def retrieval(base: KnowledgeBase, questions: list[Question], k: int = 3) -> dict[str, Any]:
    """Precision@1 and recall@k of the passage that holds the expected phrase."""
    first = within = 0
    for q in questions:
        hits = base.search(q.question, k)
        first += bool(hits) and q.stated(hits[0].passage.full_text)
        within += any(q.stated(h.passage.full_text) for h in hits)
    n = len(questions)
    return {"precision_at_1": round(first / n, 3), f"recall_at_{k}": round(within / n, 3)}


def ask(stages: Stages, questions: list[Question], seed: int) -> list[dict[str, Any]]:
    """One turn per question (a new session each); the reply and whether it states the fact."""
    rows = []
    for i, q in enumerate(questions):
        request = parse_turn(None, q.question, controls=json.dumps({"seed": seed + i}))
        final = run_turn(request, stages, lambda _event: None, lambda: "")
        stage_ms = final.timings.get("stage_ms", {})
        rows.append(
            {
                "question": q.question,
                "reply": final.reply,
                "stated": q.stated(final.reply),
                "knowledge": final.timings.get("knowledge", {}),
                "knowledge_ms": stage_ms.get("knowledge", 0.0),
                "llm_ms": stage_ms.get("llm", 0.0),
                "errors": final.errors,
            }
        )
        log.info("%s %s -> %s", "OK  " if rows[-1]["stated"] else "MISS", q.question, final.reply)
    return rows


def run(variants: tuple[str, ...], seed: int = 0, venue: Path = VENUE) -> dict[str, Any]:
    from avatar.pipeline.local import local_knowledge, local_stages
    from serving.served import local_config, local_models

    questions = load_questions()
    models = dataclasses.replace(local_models(), renderers={})
    base_config = dataclasses.replace(local_config(), knowledge_dir=venue)
    results: dict[str, Any] = {"machine": machine(), "questions": len(questions), "rows": {}}
    configs = {
        "none": dataclasses.replace(base_config, knowledge_dir=None),
        "documents": base_config,
        "served-sampling": dataclasses.replace(base_config, knowledge_sampling={}),
        "two-passages": dataclasses.replace(
            base_config, knowledge=KnowledgeConfig(passages=2, tokens=320)
        ),
        "focus-1": dataclasses.replace(base_config, knowledge=KnowledgeConfig(focus_sentences=1)),
        "focus-2": dataclasses.replace(base_config, knowledge=KnowledgeConfig(focus_sentences=2)),
    }
    results["retrieval"] = retrieval(local_knowledge(models, base_config), questions)
    for variant in variants:
        with local_stages(models, configs[variant]) as served:
            started = time.perf_counter()
            rows = ask(dataclasses.replace(served, speak=silent_speech, feel=None), questions, seed)
        stated = sum(r["stated"] for r in rows)
        knowledge_ms = [r["knowledge_ms"] for r in rows if r["knowledge_ms"]]
        results["rows"][variant] = {
            "stated": stated,
            "share": round(stated / len(rows), 3),
            "knowledge_ms_median": round(statistics.median(knowledge_ms), 1) if knowledge_ms else 0,
            "llm_ms_median": round(statistics.median(r["llm_ms"] for r in rows), 1),
            "seconds": round(time.perf_counter() - started, 1),
            "turns": rows,
        }
        log.info("%s: %d/%d stated the fact", variant, stated, len(rows))
    return results


def format_table(results: dict[str, Any]) -> str:
    n = results["questions"]
    lines = [
        "| variant | replies stating the fact | share | retrieval ms (median) | llm ms (median) |",
        "|---|---|---|---|---|",
    ]
    for variant, row in results["rows"].items():
        lines.append(
            f"| {variant} | {row['stated']}/{n} | {row['share']:.0%} | "
            f"{row['knowledge_ms_median']} | {row['llm_ms_median']} |"
        )
    if "retrieval" in results:
        r = results["retrieval"]
        lines.append("")
        lines.append(
            f"retrieval alone: precision@1 {r['precision_at_1']:.0%}, "
            f"recall@3 {r['recall_at_3']:.0%} ({n} questions)"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--seed", type=int, default=0, help="question i uses seed + i")
    parser.add_argument("--venue", type=Path, default=VENUE, help="the documents' folder")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    results = run(tuple(args.variants), args.seed, args.venue)
    save_results(args.out, "knowledge", results, format_table(results))
    return 0
