"""`python -m gateway --triton-url HOST:8001`: the live gateway against a running Triton."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from gateway.app import run
from gateway.options import SessionOptions


def command_line() -> argparse.ArgumentParser:
    """The command line; every session default is SessionOptions'."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--triton-url", default="127.0.0.1:8001", help="Triton gRPC address")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--end-silence-s",
        type=float,
        default=SessionOptions.end_silence_s,
        help="silence that ends an utterance",
    )
    parser.add_argument(
        "--speculate-after-s",
        type=float,
        default=SessionOptions.speculate_after_s,
        help="start ASR at a pause this long, before the end of speech is confirmed",
    )
    parser.add_argument(
        "--no-speculate", action="store_true", help="the avatar model transcribes each turn"
    )
    parser.add_argument(
        "--speculate-turn",
        action="store_true",
        help="at that pause also start the reply (in a fork of the conversation), held until "
        "the end of speech is confirmed",
    )
    parser.add_argument(
        "--partial-every-s",
        type=float,
        default=SessionOptions.partial_every_s,
        help="while the user speaks, transcribe the speech so far every this many seconds "
        "(what two passes agree on is where the transcript at the pause starts)",
    )
    parser.add_argument(
        "--no-partials", action="store_true", help="no transcription while the user speaks"
    )
    parser.add_argument(
        "--passes-alongside",
        action="store_true",
        help="let the passes while speaking run alongside a pass at a pause (by default that "
        "pass cancels them and none starts until it is done)",
    )
    parser.add_argument(
        "--detect-language-s",
        type=float,
        default=SessionOptions.detect_language_s,
        help="until a session's language is known, its passes while speaking wait for this "
        "much speech (Whisper guesses the language of one second badly)",
    )
    parser.add_argument("--model", default=SessionOptions.model, help="the turn model (decoupled)")
    parser.add_argument(
        "--asr-model", default=SessionOptions.asr_model, help="the speculative transcripts' model"
    )
    parser.add_argument(
        "--portrait",
        type=Path,
        help="a portrait rig folder (rig.json + photo.png): the page draws that photo with "
        "WebGL; without it, a cartoon face",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING"],
        help="DEBUG: every ASR pass and its time",
    )
    return parser


def session_options(args: argparse.Namespace) -> SessionOptions:
    return SessionOptions(
        end_silence_s=args.end_silence_s,
        speculate_after_s=None if args.no_speculate else args.speculate_after_s,
        speculate_turn=args.speculate_turn and not args.no_speculate,
        partial_every_s=None if args.no_partials or args.no_speculate else args.partial_every_s,
        detect_language_s=args.detect_language_s,
        pause_first=not args.passes_alongside,
        model=args.model,
        asr_model=args.asr_model,
    )


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(args.triton_url, session_options(args), args.host, args.port, portrait=args.portrait)


if __name__ == "__main__":
    main()
