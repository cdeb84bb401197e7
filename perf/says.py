"""`python -m perf says`: does the avatar say the right thing? Its own name and role, the
user's facts from earlier in the conversation, the operator's documents (evals/grounding).

Every conversation runs through the in-process turn (`avatar.pipeline.local`: the served
persona, sampling, reply budget, memory and retrieval, as `avatar serve` configures them);
TTS is replaced by silence (it does not change the words). Each conversation is asked with
`--seeds` sampling seeds. Rows (`--variants`) are the served settings and the steps that
led to them (`before`: as the `llm` model was before grounding), measured side by side on
the same conversations.

    python -m perf says --split dev                      # settings are chosen here
    python -m perf says --split test --variants before served   # the report's figures
    python -m perf says --split dev --variants served +candidates +candidates-embed
    python -m perf says --split test --variants served-words +subject --seeds 2 --parallel 3
    python -m perf says --split test --endpoint http://127.0.0.1:8080/v1 [--model NAME]
    python -m perf says --split test --llama-cpp [GGUF]  # starts llama.cpp's server on it

`--endpoint`: the same benchmarks against an OpenAI-compatible server (the operator's own
LLM; the decoder-side variants, which bias the packaged decoder's logits, do not apply
there: the prompt-side ones do). `--llama-cpp`: llama.cpp's OpenAI-compatible server
started here on a GGUF (default: the packaged SmolLM2's Q4_1 file) for the run. Also
printed: replies over the sentence budget and the time to the first sentence (the turn's
first audio, less TTS).
Results: build/perf/says/says.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import re
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from avatar.llm.engine import DEFAULT_PERSONA
from avatar.llm.grounding import GroundingConfig
from avatar.llm.persona import DEFAULT, Persona
from avatar.llm.stream import SentenceSplitter
from avatar.pipeline import Stages, parse_turn, run_turn
from avatar.pipeline.local import LocalConfig
from avatar.sentences import ends_sentence, spoken_text
from evals.grounding import SPLITS, Conversation, documents, persona_set, states, user_facts
from evals.report import DEFAULT_OUT, machine, save_results
from perf.knowledge import silent_speech
from serving.served import served_parameters

log = logging.getLogger(__name__)

OUT = DEFAULT_OUT / "says"
BENCHMARKS = ("name", "facts", "documents")


Variant = Callable[[LocalConfig], LocalConfig]
# the `llm` model's persona before issue 44 (a persona file rendered as now, without the
# opening exchange it then had: that exchange is gone, see docs/llm.md)
ONE_LINE_PERSONA = (
    "You are Mia, a warm and cheerful receptionist avatar. "
    "Answer in one to three short spoken sentences."
)


def _grounding(config: LocalConfig, **fields: Any) -> LocalConfig:
    llm = dataclasses.replace(config.llm, grounding=GroundingConfig(**fields))
    return dataclasses.replace(config, llm=llm)


def _before(config: LocalConfig) -> LocalConfig:
    """Without grounding; the default persona as the one-line text it was."""
    if config.llm.persona == DEFAULT_PERSONA:
        config = dataclasses.replace(
            config, llm=dataclasses.replace(config.llm, persona=ONE_LINE_PERSONA)
        )
    return _grounding(config)


def _plus_copy(config: LocalConfig) -> LocalConfig:
    return _grounding(_before(config), bonus=SERVED.bonus)


def _plus_recall(config: LocalConfig) -> LocalConfig:
    return _grounding(_before(config), **(dataclasses.asdict(SERVED) | {"subject": "words"}))


def _served_no_copy(config: LocalConfig) -> LocalConfig:
    return _grounding(config, recall=SERVED.recall, recall_persona=SERVED.recall_persona)


def _subject(judged_by: str) -> Variant:
    """The served settings, a question's subject (the avatar or not) judged by its words
    ("words": as before issue 44's fifth round) or also by the served MiniLM where its
    words speak to "you" without saying what about ("embedding"; avatar/llm/subject.py)."""

    return _grounded({"subject": judged_by}, embeds=judged_by == "embedding")


def _candidates(agreement: str, choose_after: str = "sentence") -> Variant:
    """The served settings, the first sentence (`choose_after` "piece": the first piece for
    TTS) decoded as CANDIDATES candidates side by side and the one that agrees best with
    the sources kept (`agreement`: "words", "embedding")."""

    changes = {"candidates": CANDIDATES, "agreement": agreement, "choose_after": choose_after}
    return _grounded(changes, embeds=agreement == "embedding")


def _grounded(changes: dict, embeds: bool) -> Variant:
    """The served grounding with `changes`; `embeds`: the turn gets the MiniLM they need."""

    def variant(config: LocalConfig) -> LocalConfig:
        config = _grounding(config, **(dataclasses.asdict(config.llm.grounding) | changes))
        if embeds:
            llm = dataclasses.replace(config.llm, embed=_embedding_model())
            config = dataclasses.replace(config, llm=llm)
        return config

    return variant


# worked answers in the persona, one per kind of question (few-shot), on made-up facts
FEW_SHOT = (
    'For example: asked "What is your name?", you say "My name is {name}." Told "My room is '
    '214." and later asked "What is my room number?", you say "Your room number is 214." '
    'Asked "When does the pool open?" with the information "The pool opens at 8.", you say '
    '"The pool opens at 8."'
)


def _few_shot(config: LocalConfig) -> LocalConfig:
    """The served settings, the persona followed by FEW_SHOT for its own name."""
    found = re.search(r"Your name is ([^.]+)\.", config.llm.persona)
    name = found.group(1) if found else DEFAULT.name
    persona = f"{config.llm.persona} {FEW_SHOT.format(name=name)}"
    return dataclasses.replace(config, llm=dataclasses.replace(config.llm, persona=persona))


@functools.cache
def _embedding_model() -> Callable[[list[str]], np.ndarray]:
    """The served sentence embedding model (the knowledge retriever's MiniLM, the
    `emotion_encoder` graph), in this process, one thread."""
    from avatar.pipeline.local import sentence_embedder
    from serving.served import served_onnx, served_parameters

    # this graph's file only (local_models() would check every model's INT8 gate)
    return sentence_embedder(served_onnx(served_parameters("avatar")["emotion_model"]))


SERVED = GroundingConfig.from_json(served_parameters("llm")["grounding"])
CANDIDATES = 3  # the candidate rows' count
# rows: the served settings and the steps to them, each measured on the same conversations
VARIANTS: dict[str, Variant] = {
    "before": _before,  # the one-line persona, no grounding
    "+copy": _plus_copy,  # the copy bias
    "+recall": _plus_recall,  # + what is known read beside a question about someone
    # + the default persona says "Your name is Mia."; whom a question asks about judged by
    # its words only (served until issue 44's fifth round)
    "served-words": _subject("words"),
    # + a question's subject judged by MiniLM beside its words (now served: "served")
    "+subject": _subject("embedding"),
    "served": lambda config: config,
    "served-no-copy": _served_no_copy,  # the served settings without the copy bias
    # + candidates of the first sentence, the one agreeing with the sources chosen
    "+candidates": _candidates("words"),  # by the share of content words in the sources
    "+candidates-embed": _candidates("embedding"),  # by MiniLM's cosine to a source sentence
    # judged on the first piece the TTS gets (sooner) instead of the first sentence
    "+candidates-embed-piece": _candidates("embedding", "piece"),
    "+few-shot": _few_shot,  # the persona with a worked answer per kind of question
}


def sentences(reply: str) -> int:
    """Spoken sentences in a reply, counted as the engine's budget counts them
    (avatar.llm.engine.SentenceBudget over the stream's sentence splitter)."""
    splitter = SentenceSplitter()
    pieces = [chunk.sentence for chunk in splitter.push(reply) if chunk.sentence]
    pieces.append(splitter.flush() or "")
    return sum(bool(spoken_text(p)) and ends_sentence(spoken_text(p)) for p in pieces)


def converse(stages: Stages, conversation: Conversation, session: str, seed: int) -> dict[str, Any]:
    """Say the conversation's turns in one session; judge the last reply."""
    replies, first_ms = [], []
    for n, text in enumerate(conversation.turns):
        controls = json.dumps({"seed": seed * 1000 + n})
        request = parse_turn(None, text, session, controls)
        final = run_turn(request, stages, lambda _event: None, lambda: "")
        if final.errors:
            raise RuntimeError(f"turn {text!r} failed: {final.errors}")
        replies.append(final.reply)
        first = final.timings.get("since_request_ms", {}).get("llm_first_sentence")
        if first is not None:
            first_ms.append(first)
    reply = replies[-1]
    return {
        "turns": list(conversation.turns),
        "replies": replies,
        "expect": list(conversation.expect),
        "kind": conversation.kind,
        "stated": states(reply, conversation.expect),
        "over_budget": max(sentences(r) for r in replies) > 3,
        "first_sentence_ms": first_ms,
    }


def _converse(stages: Stages, job: tuple[Conversation, str, int]) -> dict[str, Any]:
    return converse(stages, *job)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = [ms for r in rows for ms in r["first_sentence_ms"]]
    stated = sum(r["stated"] for r in rows)
    return {
        "stated": stated,
        "asked": len(rows),
        "share": round(stated / max(1, len(rows)), 3),
        "over_budget": sum(r["over_budget"] for r in rows),
        "first_sentence_ms_p50": round(statistics.median(first), 1) if first else None,
        "first_sentence_ms_p95": round(float(np.percentile(first, 95)), 1) if first else None,
        "misses": [
            {"turns": r["turns"], "reply": r["replies"][-1]} for r in rows if not r["stated"]
        ][:6],
    }


def run_benchmarks(
    split: str,
    benchmarks: tuple[str, ...],
    variants: tuple[str, ...],
    seeds: int,
    *,
    endpoint: str = "",
    model: str = "",
    parallel: int = 1,
) -> dict[str, Any]:
    from avatar.llm.openai_api import Endpoint
    from avatar.pipeline.local import local_stages
    from serving.served import local_config, local_models

    models = dataclasses.replace(local_models(), renderers={})
    served = local_config()
    if endpoint:
        served = dataclasses.replace(served, llm_endpoint=Endpoint(endpoint, model))
    names = persona_set(split, DEFAULT.name)
    own = Persona.from_mapping(names.persona)
    venue, questions = documents(split)
    # benchmark -> its conversations, each with its persona file (None: the served persona)
    sets: dict[str, list[tuple[Conversation, Persona | None]]] = {
        "name": [(c, None) for c in names.default] + [(c, own) for c in names.own],
        "facts": [(c, None) for c in user_facts(split)],
        "documents": [(c, None) for c in questions],
    }
    results: dict[str, Any] = {
        "machine": machine(),
        "split": split,
        "seeds": seeds,
        "engine": f"endpoint {endpoint}" if endpoint else "packaged SmolLM2-135M (in process)",
        "parallel": parallel,
        "rows": {},
    }
    for variant in variants:
        row: dict[str, Any] = {}
        started = time.perf_counter()
        for benchmark in benchmarks:
            rows = []
            knowledge = venue if benchmark == "documents" else None
            for persona in dict.fromkeys(p for _, p in sets[benchmark]):
                config = _configured(served, variant, persona, knowledge)
                with local_stages(models, config) as served_stages:
                    stages = dataclasses.replace(served_stages, speak=silent_speech, feel=None)
                    jobs = [
                        (conversation, f"{benchmark}-{i}-{seed}-{p.name if p else ''}", seed)
                        for i, (conversation, p) in enumerate(sets[benchmark])
                        if p == persona
                        for seed in range(seeds)
                    ]
                    # conversations side by side share the decoder's batches (faster; each
                    # one's turns still run in order)
                    with ThreadPoolExecutor(parallel) as pool:
                        done = pool.map(functools.partial(_converse, stages), jobs)
                        for (conversation, _, _), said in zip(jobs, done, strict=True):
                            rows.append(said)
                            log.info(
                                "%s %s %s -> %r",
                                variant,
                                "OK  " if said["stated"] else "MISS",
                                conversation.question,
                                said["replies"][-1][:120],
                            )
            row[benchmark] = _summary(rows) | {"conversations": rows}
        row["seconds"] = round(time.perf_counter() - started, 1)
        results["rows"][variant] = row
    return results


def _configured(
    served: LocalConfig, variant: str, persona: Persona | None, knowledge: Path | None
) -> LocalConfig:
    """The served settings changed by `variant`, for the persona file `persona` (None: the
    served default persona) and the documents."""
    config = dataclasses.replace(served, knowledge_dir=knowledge)
    if persona is not None:
        llm = dataclasses.replace(config.llm, persona=persona.system_prompt())
        config = dataclasses.replace(config, llm=llm)
    return VARIANTS[variant](config)


def format_table(results: dict[str, Any]) -> str:
    lines = [
        f"split {results['split']}, {results['seeds']} seeds, {results['engine']}, "
        f"{results['parallel']} conversation(s) at a time",
        "",
        "| variant | own name and role | user's facts | documents' facts | over budget | "
        "first sentence ms p50 / p95 |",
        "|---|---|---|---|---|---|",
    ]
    for variant, row in results["rows"].items():
        cells, over, first = [], 0, []
        for benchmark in BENCHMARKS:
            if benchmark not in row:
                cells.append("-")
                continue
            b = row[benchmark]
            cells.append(f"{b['stated']}/{b['asked']} ({100 * b['share']:.0f} %)")
            over += b["over_budget"]
            first += [ms for c in b["conversations"] for ms in c["first_sentence_ms"]]
        timing = (
            f"{statistics.median(first):.0f} / {np.percentile(first, 95):.0f}" if first else "-"
        )
        lines.append(f"| {variant} | {' | '.join(cells)} | {over} | {timing} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", choices=SPLITS, default="dev")
    parser.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS), choices=BENCHMARKS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, default=2, help="sampling seeds per conversation")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="conversations side by side (faster; the first-sentence times are then not "
        "one session's)",
    )
    parser.add_argument("--endpoint", default="", help="an OpenAI-compatible base URL")
    parser.add_argument("--model", default="", help="the endpoint's `model` field")
    parser.add_argument(
        "--llama-cpp",
        nargs="?",
        const="packaged",
        default=None,
        metavar="GGUF",
        help="start llama.cpp's server on GGUF (default: the packaged SmolLM2) and use it",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint
        if args.llama_cpp:
            endpoint = stack.enter_context(_llama_cpp(args.llama_cpp))
        results = run_benchmarks(
            args.split,
            tuple(args.benchmarks),
            tuple(args.variants),
            args.seeds,
            endpoint=endpoint,
            model=args.model,
            parallel=args.parallel,
        )
    print(format_table(results))
    save_results(args.out, "says", results, format_table(results))
    return 0


@contextlib.contextmanager
def _llama_cpp(gguf: str) -> Iterator[str]:
    """llama.cpp's server on `gguf` ("packaged": the packaged SmolLM2) while the block runs."""
    import tempfile

    from export.llm.convert import packaged_smollm2
    from serving.local_services import LlamaServer

    if gguf == "packaged":
        checkpoint = packaged_smollm2()
        gguf = str(checkpoint.folder / str(checkpoint.gguf_file))
    if not LlamaServer.installed():
        raise SystemExit("llama-cpp-python[server] is not installed: scripts/setup.sh --tests")
    with tempfile.TemporaryDirectory(prefix="says-llama-") as workdir:
        server = LlamaServer(Path(gguf)).start(Path(workdir))
        try:
            yield server.url
        finally:
            server.stop()
