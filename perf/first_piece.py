"""Start speaking sooner: the reply's first piece for TTS at a clause break vs a full stop.

`python -m perf first-piece` runs the LLM (`ChatEngine` over the exported decoder, ONNX
Runtime, 1 thread, warm prefix cache) and the TTS voice in-process on the spoken questions,
once per setting of `first_clause_words`, alternating settings per question in one run.
The reply text is the same in every setting (fixed seed per question); only where the
first piece ends differs. Per setting: ms from submit to the first piece, ms to synthesise
it, their sum (the first audio, without ASR and transport), and the words of the piece;
median and p95. Written to build/perf/first_piece/first_piece.{json,md}.

`--served`: the same questions and seeds also as text turns of the `avatar` model on an
embedded server (today's repository), alternated with the in-process path per question:
what serving adds to the first piece and the first audio (build/perf/first_piece/served.*).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from evals.report import DEFAULT_OUT, save_results

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "first_piece"
SETTINGS = (0, 4, 6, 8)
# questions whose answers tend to open with a long sentence, and the demo's short ones
QUESTIONS = (
    "Can you tell me everything I need to know about checking in and out of the hotel?",
    "What is there to do around here on a rainy afternoon with two kids?",
    "Could you explain how the airport shuttle works, with times and prices?",
    "I have a big meeting tomorrow morning, how should I prepare, and where can I print?",
    "What restaurants would you recommend nearby, and which one is best for a birthday?",
    "Hello! When can I check in?",
    "Where is breakfast served?",
    "How do I get to the station?",
)


def _in_process(settings, max_tokens: int):
    """(engines per first_clause_words, the synthesizer, the voice), warm."""
    from avatar.llm.decoder import OrtDecoder
    from avatar.llm.engine import ChatEngine, EngineConfig
    from avatar.llm.sampling import SamplingParams
    from avatar.llm.tokenizer import Tokenizer
    from avatar.tts.phonemes import Phonemizer
    from avatar.tts.synth import Controls, Synthesizer, onnx_infer
    from avatar.tts.voice import packaged_voice
    from export.common import onnx_session
    from export.registry import ensure_all
    from serving.served import served_onnx

    art = ensure_all(["llm_decoder", "tts_vits"])
    decoder, tokenizer = (
        OrtDecoder(served_onnx("llm_decoder")),
        Tokenizer(art["llm_decoder"]),
    )
    voice = packaged_voice()
    synth = Synthesizer(Phonemizer(voice.config), onnx_infer(onnx_session(served_onnx("tts_vits"))))
    engines = {
        n: ChatEngine(
            decoder,
            tokenizer,
            EngineConfig(first_clause_words=n, sampling=SamplingParams(max_tokens=max_tokens)),
        )
        for n in settings
    }
    for engine in engines.values():  # warm: the persona's prefix cache, ORT sessions
        list(engine.chat(json.dumps([{"role": "user", "content": "Hi"}])))
    list(synth.stream("Hello there.", Controls.defaults(voice.config, seed=0)))
    return engines, synth, voice


def _first_audio(engine, synth, voice, q: int) -> dict:
    """The first piece of question q's reply (seed q) and its synthesis, in-process."""
    from avatar.tts.synth import Controls

    sampling = json.dumps({"seed": q})  # the engine's default sampling otherwise
    messages = json.dumps([{"role": "user", "content": QUESTIONS[q]}])
    started = time.perf_counter()
    piece = None
    for event in engine.chat(messages, "", sampling):
        if piece is None:
            piece = next((c.sentence for c in event.chunks if c.sentence), None)
            llm_s = time.perf_counter() - started
    piece = piece or ""
    synth_started = time.perf_counter()
    next(iter(synth.stream(piece or ".", Controls.defaults(voice.config, seed=q))), None)
    tts_s = time.perf_counter() - synth_started
    return {
        "question": q,
        "piece": piece,
        "words": len(piece.split()),
        "llm_ms": llm_s * 1000,
        "tts_ms": tts_s * 1000,
        "first_audio_ms": (llm_s + tts_s) * 1000,
    }


def run(settings=SETTINGS, rounds: int = 2, max_tokens: int = 64) -> dict:
    engines, synth, voice = _in_process(settings, max_tokens)
    rows: dict[int, list[dict]] = {n: [] for n in settings}
    for round_ in range(rounds):
        for q in range(len(QUESTIONS)):
            order = settings if (q + round_) % 2 == 0 else tuple(reversed(settings))
            for n in order:
                rows[n].append(_first_audio(engines[n], synth, voice, q))
    return {"rounds": rounds, "max_tokens": max_tokens, "questions": QUESTIONS, "rows": rows}


def served(rounds: int = 2, max_tokens: int = 64, url: str | None = None) -> dict:
    """The same questions and seeds as text turns of the `avatar` model on an embedded
    server (today's models and config) and in-process (the served first_clause_words),
    alternated per question: what the serving adds to the first piece and the first audio.
    `avatar`'s own milestones (`llm_first_sentence`, `first_audio` since the request).
    url: a running server's gRPC address instead of an embedded one."""
    from clients.avatar_stream import stream_turn
    from perf.harness import serve
    from serving.served import served_parameters

    words = int(served_parameters("llm")["first_clause_words"])
    engines, synth, voice = _in_process((words,), max_tokens)
    rows: dict[str, list[dict]] = {"served": [], "in-process": []}
    with serve(url) as target:
        url = target.grpc_url
        controls = {"render": False, "max_tokens": max_tokens}
        stream_turn(url, text="Hi", controls={**controls, "seed": 0})  # warm
        for round_ in range(rounds):
            for q, question in enumerate(QUESTIONS):
                local = _first_audio(engines[words], synth, voice, q)
                turn = stream_turn(url, text=question, controls={**controls, "seed": q})
                since = turn.timings["since_request_ms"]
                piece = turn.sentences[0]["text"] if turn.sentences else ""
                remote = {
                    "question": q,
                    "piece": piece,
                    "words": len(piece.split()),
                    "llm_ms": since["llm_first_sentence"],
                    "tts_ms": since["first_audio"] - since["llm_first_sentence"],
                    "first_audio_ms": since["first_audio"],
                    "client_first_audio_ms": turn.first_audio_s * 1000,
                    "same_piece": piece.strip() == local["piece"].strip(),
                }
                pair = [("served", remote), ("in-process", local)]
                for name, row in pair if (q + round_) % 2 == 0 else reversed(pair):
                    rows[name].append(row)
    return {"rounds": rounds, "max_tokens": max_tokens, "questions": QUESTIONS, "rows": rows}


def summary(results: dict) -> str:
    lines = [
        "| first_clause_words | first piece ms p50 / p95 | its TTS ms p50 / p95 "
        "| first audio ms p50 / p95 | words p50 | vs 0 (p50) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = None
    for n, rows in results["rows"].items():

        def pct(key: str, rows=rows) -> tuple[float, float]:
            values = [r[key] for r in rows]
            return float(np.percentile(values, 50)), float(np.percentile(values, 95))

        llm, tts, audio = pct("llm_ms"), pct("tts_ms"), pct("first_audio_ms")
        base = audio[0] if base is None else base
        lines.append(
            f"| {n or 'off (full sentence)'} | {llm[0]:.0f} / {llm[1]:.0f} "
            f"| {tts[0]:.0f} / {tts[1]:.0f} | {audio[0]:.0f} / {audio[1]:.0f} "
            f"| {np.median([r['words'] for r in rows]):.0f} | {base / audio[0]:.2f}x |"
        )
    return "\n".join(lines)


def served_summary(results: dict) -> str:
    rows = results["rows"]
    same = sum(r["same_piece"] for r in rows["served"])
    lines = [
        f"{same} of {len(rows['served'])} first pieces identical in both paths",
        "",
        "| path | first piece ms p50 / p95 | then first audio ms p50 / p95 "
        "| first audio ms p50 / p95 | served / in-process (p50) |",
        "|---|---:|---:|---:|---:|",
    ]
    base = float(np.percentile([r["first_audio_ms"] for r in rows["in-process"]], 50))
    for name, group in rows.items():
        cells = []
        for key in ("llm_ms", "tts_ms", "first_audio_ms"):
            values = [r[key] for r in group]
            cells.append(f"{np.percentile(values, 50):.0f} / {np.percentile(values, 95):.0f}")
        ratio = np.percentile([r["first_audio_ms"] for r in group], 50) / base
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--settings", type=int, nargs="*", default=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--served",
        action="store_true",
        help="the served first_clause_words only, through the avatar model of an embedded "
        "server and in-process, side by side: what the serving adds",
    )
    parser.add_argument("--url", help="--served: a running server instead of an embedded one")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    if args.served:
        results = served(args.rounds, url=args.url)
        save_results(args.out, "served", results, served_summary(results))
        return 0
    results = run(tuple(args.settings), args.rounds)
    save_results(args.out, "first_piece", results, summary(results))
    return 0
